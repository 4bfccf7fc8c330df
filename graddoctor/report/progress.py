"""A single status line on stderr while the script runs: ``graddoctor ▸ train.py · step 3/10``.

Only when stderr is a terminal. It never garbles the script's own output: while it is active,
``sys.stdout`` and ``sys.stderr`` are thin proxies that erase the status line before the script
writes anything, and the line is redrawn only at a step, at most every ``REDRAW_S`` while it is still shown,
and only at the start of a line (a script's half-written line is never overwritten). Output that bypasses ``sys.stdout``
(``os.write(1, ...)``, worker processes) can still land after the status text; it is then
cleared at the next step.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

CLEAR_LINE = "\r\x1b[2K"
# a line still shown is redrawn at most this often: a run of short steps would otherwise flush
# the script's streams and write to the terminal at every one of them
REDRAW_S = 0.1


def stream_is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


class _ErasingStream:
    """Proxy of a text stream: erases the status line before each write, else delegates."""

    def __init__(self, stream, progress: "Progress"):
        self._stream = stream
        self.progress = progress  # the progress line that put this proxy in place

    def write(self, text):
        self.progress.before_output(text)
        return self._stream.write(text)

    def writelines(self, lines):
        lines = list(lines)
        self.progress.before_output("".join(lines))
        return self._stream.writelines(lines)

    def __getattr__(self, name):  # buffer, fileno, isatty, encoding, flush, ...
        return getattr(self._stream, name)

    def __iter__(self):
        return iter(self._stream)


class Progress:
    """Context manager around the replay; ``update(steps)`` is the Recorder's step callback."""

    def __init__(self, label: str, budget: int | None, stream=None, enabled: bool | None = None,
                 redraw_s: float = REDRAW_S):
        self.label = label
        self.redraw_s = redraw_s
        self._drawn_at = float("-inf")
        self.budget = budget
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = stream_is_terminal(self.stream) if enabled is None else enabled
        self.shown = False
        self.at_line_start = True  # the script's last output ended a line
        self._saved: tuple | None = None

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._saved = (sys.stdout, sys.stderr)
            sys.stdout = _ErasingStream(sys.stdout, self)
            sys.stderr = _ErasingStream(sys.stderr, self)
            self.update(0)
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        self.clear()
        out, err = self._saved
        if isinstance(sys.stdout, _ErasingStream) and sys.stdout.progress is self:
            sys.stdout = out
        if isinstance(sys.stderr, _ErasingStream) and sys.stderr.progress is self:
            sys.stderr = err

    def text(self, steps: int) -> str:
        of = f"/{self.budget}" if self.budget else ""
        return f"graddoctor ▸ {self.label} · step {steps}{of}"

    def update(self, steps: int) -> None:
        if not self.enabled or not self.at_line_start:
            return
        now = time.monotonic()
        if self.shown and now - self._drawn_at < self.redraw_s:
            return  # a line still on screen, drawn a moment ago: short steps are not each drawn
        self._drawn_at = now
        for stream in self._saved or ():
            try:
                stream.flush()  # the script's pending output goes first
            except (OSError, ValueError):
                pass
        width = shutil.get_terminal_size((80, 24)).columns
        self._write(CLEAR_LINE + self.text(steps)[: max(10, width - 1)])  # one row: \r must reach it
        self.shown = True

    def before_output(self, text: str) -> None:
        if self.shown:
            self._write(CLEAR_LINE)
            self.shown = False
        if text:
            self.at_line_start = text.endswith("\n")

    def clear(self) -> None:
        if self.shown:
            self._write(CLEAR_LINE)
            self.shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # the terminal went away: stop drawing, never fail the run
