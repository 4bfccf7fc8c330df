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


def _ours(filename: str) -> bool:
    return filename.startswith(_PKG_DIR) or filename.startswith("<graddoctor")


_OVERRIDES = os.path.join("torch", "overrides.py")


def _past_ours(frame, below):
    """``frame`` and the frames above it that are ours, passed over: the first that is not, and
    how many were passed. A torch function mode of ours adds the dispatch of a Python function
    of torch's (``F.mse_loss``): above our handler, ``torch/overrides.py``'s frame and the
    function's first call, which handed itself to the mode (``below``'s code again); those are
    passed too, so a warning names what it names without the mode."""
    passed = 0
    while frame is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
        passed += 1
        if passed and frame is not None and frame.f_code.co_filename.endswith(_OVERRIDES):
            while frame is not None and frame.f_code.co_filename.endswith(_OVERRIDES):
                frame = frame.f_back
                passed += 1
            if frame is not None and below is not None and frame.f_code is below.f_code:
                frame = frame.f_back
                passed += 1
    return frame, passed


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
                    below, frame = frame, frame.f_back
                    frame, passed = _past_ours(frame, below)
                    extra += passed
                frame, passed = _past_ours(frame, None)
                extra += passed
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
