"""Find the user's line: the first stack frame that is not graddoctor, torch or the stdlib."""

from __future__ import annotations

import os
import sys
import sysconfig

from .trace import Location

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _library_roots() -> tuple[str, ...]:
    roots = {_PKG_DIR}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
            roots.add(path)
    try:  # torch's own folder wherever it lives
        import torch

        roots.add(os.path.dirname(os.path.abspath(torch.__file__)))
    except Exception:  # pragma: no cover - torch is a dependency
        pass
    for name in ("typer", "click", "rich"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.add(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(sorted(roots))


class LocationFinder:
    """Caches, per code object filename, whether a frame belongs to the user."""

    def __init__(self, relative_to: str | None = None):
        self._roots = _library_roots()
        self._is_user: dict[str, bool] = {}
        # the working directory the check started in: relative file names are resolved against
        # it and shown relative to it, also after the script changed directory
        self._rel = os.path.abspath(relative_to or os.getcwd())
        self._display: dict[str, str] = {}
        self._locations: dict[tuple, Location] = {}  # (code object, line) -> its Location

    def is_user_file(self, filename: str) -> bool:
        known = self._is_user.get(filename)
        if known is None:
            if filename.startswith("<"):  # <frozen ...>, <string>: generated code
                known = filename.startswith("<ipython-input-")  # a cell of terminal IPython
            else:
                path = self.absolute(filename)
                known = not any(path == r or path.startswith(r + os.sep) for r in self._roots)
                if known and ("site-packages" in path or "dist-packages" in path):
                    known = False  # third-party libraries: keep looking for the user's line
            self._is_user[filename] = known
        return known

    @property
    def base_dir(self) -> str:
        """The folder shown paths are relative to (the working directory at the start)."""
        return self._rel

    def absolute(self, filename: str) -> str:
        """A code object's file name as an absolute path: a relative one is relative to where
        the check started (the script may have changed directory since)."""
        return os.path.normpath(os.path.join(self._rel, filename))

    def display_path(self, filename: str) -> str:
        shown = self._display.get(filename)
        if shown is None and filename.startswith("<"):
            shown = self._display[filename] = filename
        if shown is None:
            path = self.absolute(filename)
            try:
                rel = os.path.relpath(path, self._rel)
                shown = path if rel.startswith("..") else rel
            except ValueError:  # other drive on Windows
                shown = path
            self._display[filename] = shown
        return shown

    def user_frames(self, frame):
        """The user's frames on a stack, innermost first, from ``frame`` outward: the one stack
        walk every caller shares (locations, the mode watcher, the watchdog, parameter names)."""
        is_user = self.is_user_file
        while frame is not None:
            if is_user(frame.f_code.co_filename):
                yield frame
            frame = frame.f_back

    def location(self, frame) -> Location:
        """A frame's location, cached per code line (the same few call lines recur every step)."""
        code = frame.f_code
        key = (code, frame.f_lineno)
        location = self._locations.get(key)
        if location is None:
            location = self._locations[key] = Location(self.display_path(code.co_filename),
                                                       key[1], code.co_name)
        return location

    def here(self, skip: int = 1) -> Location | None:
        """Location of the innermost user frame above the caller; without one, the outermost
        third-party library frame that called into torch (a framework's own loop)."""
        start = sys._getframe(skip)
        for frame in self.user_frames(start):  # hot path: several times per step
            return self.location(frame)
        fallback = None
        frame = start
        while frame is not None:
            filename = frame.f_code.co_filename
            if fallback is None and "site-packages" in filename and not filename.startswith(_PKG_DIR):
                fallback = frame
            frame = frame.f_back
        if fallback is not None:
            f = fallback
            return Location(self.display_path(f.f_code.co_filename), f.f_lineno, f.f_code.co_name)
        return None

    def from_traceback(self, tb) -> Location | None:
        """The deepest user frame of an exception's traceback (where the user's code failed)."""
        found = None
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if self.is_user_file(filename):
                found = Location(self.display_path(filename), tb.tb_lineno, tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        return found
