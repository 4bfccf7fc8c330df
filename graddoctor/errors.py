"""graddoctor's own exceptions, importable without torch."""

from __future__ import annotations


class ScriptError(Exception):
    """The target cannot be run at all (missing file, not Python, syntax error, bad option)."""


class WatchError(RuntimeError):
    """``graddoctor.watch()`` (or a check) entered while another one is active in this
    process: the instrumentation patches torch process-wide, so two cannot run at once."""


def did_you_mean(word: str, candidates, limit: int = 1) -> str:
    """``" (did you mean 'steps'?)"`` for a typo of one of ``candidates`` (difflib's close
    matches, case-insensitive), or ``""`` when nothing is close."""
    import difflib

    by_lower = {}
    for candidate in candidates:
        by_lower.setdefault(str(candidate).lower(), str(candidate))
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=limit, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(by_lower[c]) for c in close)}?)"
