"""Warnings raised through graddoctor's wrappers name the user's line, as without graddoctor.

torch warns with ``stacklevel=2`` (or more) to name its caller; when the caller is one of
graddoctor's wrappers (a scheduler's step, a watched loss function), the warning would name
graddoctor's file and module: ``-W error::UserWarning:__main__`` stops matching, and a script
that checks ``w.filename`` sees another file. While a check runs, ``warnings.warn`` counts
graddoctor's frames out of the stack level (``skip_file_prefixes`` does this on 3.12+ only, and
only for the warner's own call). Costs nothing until a warning is issued.
"""

from __future__ import annotations

import os
import sys
import warnings

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


_DISPATCH = os.path.join("torch", "overrides.py")


def _ours(filename: str) -> bool:
    return filename.startswith(_PKG_DIR) or filename.startswith("<graddoctor")


def _past_ours(frame, extra: int):
    """``(frame, extra)`` past graddoctor's frames from ``frame`` on, counted in ``extra``. When a
    mode of graddoctor's ran the call (its ``__torch_function__``), torch's dispatch to it and the
    public function that dispatched are not counted either: without the mode, the function the
    mode called again is the one that warned, called from the script."""
    skipped = False
    while frame is not None and _ours(frame.f_code.co_filename):
        frame, extra, skipped = frame.f_back, extra + 1, True
    if skipped and frame is not None and frame.f_code.co_filename.endswith(_DISPATCH):
        while frame is not None and frame.f_code.co_filename.endswith(_DISPATCH):
            frame, extra = frame.f_back, extra + 1
        if frame is not None:
            frame, extra = frame.f_back, extra + 1
    return frame, extra


def _skipping_our_frames(original):
    def warn(message, category=None, stacklevel=1, source=None, **kwargs):
        try:
            if type(stacklevel) is int and stacklevel >= 1 and not kwargs:
                frame = sys._getframe(1)  # stacklevel 1: the code that called warn()
                extra = 0
                # our frames anywhere on the way up are not counted (a wrapper around
                # torch.autograd.backward sits between torch's frames: a hook's warning with
                # stacklevel=5 names the script's backward line), nor is the frame it lands on
                for _ in range(stacklevel - 1):
                    if frame is None:
                        break
                    frame, extra = _past_ours(frame.f_back, extra)
                frame, extra = _past_ours(frame, extra)
                if frame is not None:
                    stacklevel += extra
        except Exception:  # never change what the warning does over our own failure
            pass
        return original(message, category, stacklevel + 1, source, **kwargs)

    warn.__wrapped__ = original
    return warn


class _ScriptBuiltin:
    """TorchScript compiles ``warnings.warn`` in torch's functions as its builtin ``aten::warn``,
    found by the function's id: the replacement is registered as the same builtin while it is
    installed (else ``torch.jit.script`` tries to compile it)."""

    # the entry only names the replacement function: with that patch out, nothing reads it
    # (benchmarks/overhead.py leaves it in while it suspends the patches)
    follows_a_patch = True

    def __init__(self, fn) -> None:
        self.key = None
        try:
            from torch.jit import _builtins

            table = _builtins._get_builtin_table()
            self.table, self.key = table, id(fn)
            table[self.key] = "aten::warn"
        except Exception:  # another torch: scripted code then sees the replacement
            pass

    def remove(self) -> None:
        if self.key is not None:
            self.table.pop(self.key, None)
            self.key = None


class WarningSource:
    """Installs the ``warnings.warn`` that skips graddoctor's frames."""

    def install(self, patcher) -> None:
        warn = _skipping_our_frames(warnings.warn)
        patcher.patch(warnings, "warn", warn)
        patcher.handle(_ScriptBuiltin(warn))
