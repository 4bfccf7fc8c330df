"""Functional dropout left at its default ``training=True`` in a module that is in eval mode.

``F.dropout`` (and ``dropout1d/2d/3d``) default to ``training=True``: called in a forward as
``F.dropout(x, p)`` it keeps dropping after ``model.eval()``. ``nn.Dropout`` passes
``self.training`` and the deliberate MC-dropout idiom passes ``training=True``: both give the
argument, so only a call that leaves it out can be this bug. (``alpha_dropout`` and
``feature_alpha_dropout`` default to ``training=False``; ``torch.dropout`` has no default.)

The public names in ``torch.nn.functional`` are patched before the user's script is imported,
so ``F.dropout`` looked up at call time and ``from torch.nn.functional import dropout`` both
reach the wrapper; torch's own modules call ``F.dropout`` too (with the argument given).
``torch.jit.script`` compiles torch's function, not the wrapper (``__prepare_scriptable__``).

Cost per call: a call that gives ``training`` (``nn.Dropout``, every torch module) or p = 0 only
pays the wrapper. A call that leaves it out, made from the user's own file, looks for the module
whose method made it (usually the calling frame itself: ``self`` of a ``forward``) and reads its
``.training``. The first such call in eval mode from a call line is recorded (a
``dropout_default`` aside event, see ``Recorder.emit_aside``); that line is not looked at again.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .. import events as ev
from .inlinable import watched
from .names import variable_name
from .recorder import Recorder

NAMES = ("dropout", "dropout1d", "dropout2d", "dropout3d")  # training=True by default
_CALL_CODES = frozenset({torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__})
_MAX_FRAMES = 64  # how far up from the call to look for the module


class FunctionalDropoutWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._done: set[tuple] = set()  # (code, line): call sites recorded, or not the user's
        self._method: dict = {}  # code object -> its first argument is ``self``

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            if len(args) < 3 and "training" not in kwargs:  # training left at its default
                try:
                    watcher._check(fn, args, kwargs, sys._getframe(2))  # the caller of F.dropout
                except Exception as exc:
                    rec.internal_error(f"F.{fn}", exc)

        dropout = watched(original, before)  # torch.compile inlines it (inlinable.py)
        dropout.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return dropout

    def _check(self, fn: str, args, kwargs, caller) -> None:
        code = caller.f_code
        site = (code, caller.f_lineno)
        if site in self._done:
            return  # recorded already, or a library's own call
        if not self.rec.finder.is_user_file(code.co_filename):
            self._done.add(site)  # torch's own calls pass the argument or p = 0 in eval mode
            return
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        if isinstance(p, torch.Tensor):
            return  # reading it could wait for the device
        try:
            p = float(p)
        except (TypeError, ValueError):
            return  # torch reports it
        if not p > 0:
            return  # p = 0 drops nothing
        frame, module = self._module_of(caller)
        if module is None or module.training:
            return
        self._done.add(site)
        self.rec.emit_aside(ev.dropout_default(
            fn=fn, p=p, cls=type(module).__name__, name=self._name(module, frame),
            grad=torch.is_grad_enabled()), self.rec.finder.location(caller))

    def _module_of(self, frame):
        """The innermost frame, from ``frame`` up, that runs a method of an ``nn.Module`` (the
        user's ``forward`` calling ``F.dropout``, or the forward a helper was called from), and
        that module; (None, None) outside any."""
        method, Module = self._method, torch.nn.Module
        for _ in range(_MAX_FRAMES):
            if frame is None:
                break
            code = frame.f_code
            is_method = method.get(code)
            if is_method is None:
                is_method = method[code] = code.co_argcount > 0 and code.co_varnames[0] == "self"
            if is_method:
                owner = frame.f_locals.get("self")
                if isinstance(owner, Module):
                    return frame, owner
            frame = frame.f_back
        return None, None

    def _name(self, module, frame) -> str | None:
        """``model.blocks.0``: the user's variable for the outermost module being called, then
        the path inside it (once per recorded call line)."""
        outer = None
        f = frame
        while f is not None:
            if f.f_code in _CALL_CODES:
                outer = f
            f = f.f_back
        root = outer.f_locals.get("self") if outer is not None else None
        if not isinstance(root, torch.nn.Module):
            return None
        site = next(self.rec.finder.user_frames(outer.f_back), None)
        prefix = variable_name(root, site) or type(root).__name__
        for path, m in root.named_modules():
            if m is module:
                return f"{prefix}.{path}" if path else prefix
        return None

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
