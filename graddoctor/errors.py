"""graddoctor's own exceptions, importable without torch."""

from __future__ import annotations


class ScriptError(Exception):
    """The target cannot be run at all (missing file, not Python, syntax error, bad option)."""


class WatchError(RuntimeError):
    """``graddoctor.watch()`` (or a check) entered while another one is active in this
    process: the instrumentation patches torch process-wide, so two cannot run at once."""
