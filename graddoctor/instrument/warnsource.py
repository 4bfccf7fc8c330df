"""Warnings raised through graddoctor's wrappers name the user's line, as without graddoctor.

torch warns with ``stacklevel=2`` (or more) to name its caller; when the caller is one of
graddoctor's wrappers (a scheduler's step, a watched loss function), the warning would name
graddoctor's file and module: ``-W error::UserWarning:__main__`` stops matching, and a script
that checks ``w.filename`` sees another file. While a check runs, ``warnings.warn`` counts
graddoctor's frames out of the stack level (``skip_file_prefixes`` does this on 3.12+ only, and
only for the warner's own call). A warning torch raises from C++ (``TORCH_WARN``) takes no stack
level: it names the Python frame running when it was raised, which is graddoctor's while one of
its torch function modes dispatches the op. Such a warning, once it reaches
``warnings._showwarnmsg``, is issued again at the script's frame (its filters, module and
registry), as without the mode. Costs nothing until a warning is issued.
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


def _issued_again_at_the_script(original):
    """``warnings._showwarnmsg`` for warnings that name one of graddoctor's frames: the filters
    ran for that frame, so the warning is taken back out of its registry and issued again with
    ``warn_explicit`` at the script's frame above it; any other is shown as it is."""

    def _showwarnmsg(msg):
        try:
            if _ours(msg.filename):
                frame = sys._getframe(1)
                while frame is not None and not (frame.f_code.co_filename == msg.filename
                                                 and frame.f_lineno == msg.lineno):
                    frame = frame.f_back
                if frame is not None:
                    ours = frame.f_globals.get("__warningregistry__")
                    script, _ = _past_ours(frame, 0)
                    if script is not None and not _ours(script.f_code.co_filename):
                        text, category = str(msg.message), msg.category
                        if isinstance(ours, dict):
                            ours.pop((text, category, msg.lineno), None)
                            if ours.pop((text, category, 0), None) is None and \
                                    warnings.onceregistry.get((text, category)):
                                warnings.onceregistry.pop((text, category), None)
                        g = script.f_globals
                        warnings.warn_explicit(msg.message, category, script.f_code.co_filename,
                                               script.f_lineno, module=g.get("__name__"),
                                               registry=g.setdefault("__warningregistry__", {}),
                                               module_globals=g)
                        return None
        except Warning:  # an "error" filter at the script's line: raised as without graddoctor
            raise
        except Exception:  # never change what the warning does over our own failure
            pass
        return original(msg)

    _showwarnmsg.__wrapped__ = original
    return _showwarnmsg


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
    """Installs the ``warnings.warn`` that skips graddoctor's frames, and the ``_showwarnmsg``
    that moves a C++ warning raised under one of its modes to the script's frame."""

    def install(self, patcher) -> None:
        warn = _skipping_our_frames(warnings.warn)
        patcher.patch(warnings, "warn", warn)
        patcher.patch(warnings, "_showwarnmsg", _issued_again_at_the_script(warnings._showwarnmsg))
        patcher.handle(_ScriptBuiltin(warn))
