"""Dropout that runs in training mode while the module that calls it is in eval mode.

Every way the user's own code can run a dropout by hand is watched, as one mechanism: a
stochastic op called with "training on" from a method of a module that is in eval mode.

* ``F.dropout`` (and ``dropout1d/2d/3d``) left at the default ``training=True`` (``how``
  "default"): ``F.dropout(x, p)`` in a forward keeps dropping after ``model.eval()``;
* a training flag that is given and true (``F.dropout(x, p, True)``, ``training=self.drop_on``,
  ``F.alpha_dropout``/``feature_alpha_dropout`` with ``training=True``, ``torch.dropout(x, p,
  True)`` and torch's other ``*dropout*`` functions, which have no default) ("explicit");
  ``training=self.training`` is never true in eval mode;
* ``F.scaled_dot_product_attention(..., dropout_p=p)`` with p > 0 (SDPA has no training
  argument: ``dropout_p=self.dropout if self.training else 0.0`` is the correct form) ("sdpa").

A call with the flag given and equal to the calling module's mode (``training=self.training``)
makes that module a dropout holder of the mode watcher (instrument/modes.py); its later calls
with the flag false under grad mode are handed to it (while any holder exists, such a call
looks up its calling module: nn.Dropout's own calls in eval mode find themselves at once).

Monte Carlo dropout passes ``training=True`` on purpose: a flag written as the literal ``True``
is taken at its word. Another flag that is true in eval mode (a config attribute read instead of
``self.training``) or an SDPA rate is reported only when nothing around the call says that
sampling is meant: a word such
as ``mc``, ``monte``/``carlo``, ``bayes``, ``uncertainty``, ``samples``/``sampling``,
``stochastic``, ``posterior``, ``predictive`` in the call's line, in the module's class name or
in the names of the user's functions on the stack (``def mc_predict``, ``class MCDropoutNet``,
``training=self.training or self.mc_dropout``) keeps it silent. ``nn.Dropout`` layers that are
not registered in the module that calls them are the mode watcher's (instrument/modes.py).

The public names in ``torch.nn.functional`` and ``torch`` are patched before the user's script
is imported, so ``F.dropout`` looked up at call time and ``from torch.nn.functional import
dropout`` both reach the wrapper; torch's own modules call them too (with the argument given,
from torch's files: one set lookup per call, then nothing). ``torch.jit.script`` compiles
torch's function, not the wrapper (``__prepare_scriptable__``).

Cost per call: a call with training false or p = 0 only pays the wrapper; a call from a known
line of a library (nn.Dropout, nn.MultiheadAttention, a transformers attention) pays one set
lookup. A call from the user's own file looks for the module whose method made it (usually the
calling frame itself: ``self`` of a ``forward``) and reads its ``.training``. The first such
call in eval mode from a call line is recorded (a ``dropout_default`` aside event, see
``Recorder.emit_aside``); that line is not looked at again.
"""

from __future__ import annotations

import linecache
import re
import sys

import torch
import torch.nn.functional as F

from .. import events as ev
from ..location import site_key
from .inlinable import watched
from .names import variable_name
from .recorder import Recorder

# torch.nn.functional: name -> the default of its ``training`` argument (third, after input, p)
FUNCTIONAL = {"dropout": True, "dropout1d": True, "dropout2d": True, "dropout3d": True,
              "alpha_dropout": False, "feature_alpha_dropout": False}
NAMES = tuple(FUNCTIONAL)  # kept for callers that list the F names
# torch: ``train`` (third) has no default
TORCH = ("dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout",
         "feature_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_")
SDPA = "scaled_dot_product_attention"
# ids of code objects: a membership test by the code object itself would hash each frame's code
_CALL_CODES = frozenset(map(id, (torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__)))
_MAX_FRAMES = 64  # how far up from the call to look for the module
# words that say dropout at evaluation time is meant (Monte Carlo dropout, uncertainty sampling)
MC_WORDS = frozenset({"mc", "mcd", "mcdropout", "monte", "carlo", "bayes", "bayesian", "uncertainty",
                      "uncertain", "samples", "sampling", "stochastic", "posterior", "predictive",
                      "epistemic", "aleatoric"})
_LITERAL_TRUE = re.compile(r"\bTrue\b")
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")


def words(text: str) -> set[str]:
    """``MCDropoutNet`` / ``mc_predict`` -> {'mc', 'dropout', 'net'} / {'mc', 'predict'}."""
    return {w.lower() for w in _WORD.findall(text)}


class FunctionalDropoutWatcher:
    def __init__(self, rec: Recorder, modes=None):
        self.rec = rec
        # the mode watcher (instrument/modes.py), told of the modules whose own code runs dropout
        # with their mode as its flag (``F.dropout(x, p, self.training)``): to it they are
        # dropout layers that ``eval()`` switches off
        self.modes = modes
        self._done: set[tuple] = set()  # site_key: call sites recorded, or not the user's
        self._train_seen: set[tuple] = set()  # site_key: default-flag calls told in train mode
        self._method: dict = {}  # id of a code object -> its first argument is ``self``
        self._codes: dict[int, object] = {}  # the code objects whose ids are keys here

    def _wrap(self, original, fn: str, default: bool | None, sdpa: bool = False):
        watcher, rec, done, codes = self, self.rec, self._done, self._codes
        name = "training" if default is not None else "train"

        def before(args, kwargs) -> None:
            if sdpa:
                p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
                how = "sdpa"
                if p is None or (type(p) in (float, int) and not p):
                    return  # eval-safe code passes 0.0 (nanoGPT, transformers, torch's own)
            else:
                if len(args) > 2:
                    training, how = args[2], "explicit"
                elif name in kwargs:
                    training, how = kwargs[name], "explicit"
                else:
                    training, how = default, "default"
                if training is False or training is None:
                    if training is False and how == "explicit" and watcher.modes is not None \
                            and watcher.modes.holders and torch.is_grad_enabled():
                        watcher._switched_off(fn, args, kwargs, sys._getframe(2))
                    return
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            caller = sys._getframe(2)  # the caller of F.dropout
            if site_key(caller, codes) in done:
                return  # recorded already, or a library's own call
            try:
                watcher._check(fn, how, p, caller)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        dropout = watched(original, before)  # torch.compile inlines it (inlinable.py)
        dropout.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return dropout

    def _check(self, fn: str, how: str, p, caller) -> None:
        code = caller.f_code
        site = site_key(caller, self._codes)
        if not self.rec.finder.is_user_file(code.co_filename):
            self._done.add(site)  # torch's own calls pass the argument or p = 0 in eval mode
            return
        if isinstance(p, torch.Tensor):
            return  # reading it could wait for the device
        try:
            p = float(p)
        except (TypeError, ValueError):
            return  # torch reports it
        if not p > 0:
            return  # p = 0 drops nothing
        frame, module = self._module_of(caller)
        if module is None:
            return
        if module.training:
            if how == "explicit" and self.modes is not None:
                self.modes.hold_functional(module, p)  # F.dropout(x, p, self.training)
            elif how == "default" and site not in self._train_seen:
                # the run may stop before the script evaluates: the call is told now, in train
                # mode, and the rule asks the source whether the model is ever put in eval mode
                self._train_seen.add(site)
                self.rec.emit_aside(ev.dropout_default(
                    fn=fn, p=p, cls=type(module).__name__, name=self._name(module, frame),
                    grad=torch.is_grad_enabled(), how=how, mode="train"),
                    self.rec.finder.location(caller))
            return
        self._done.add(site)
        if how == "explicit" and _LITERAL_TRUE.search(linecache.getline(code.co_filename, site[1])):
            return  # training=True written out: Monte Carlo dropout, the documented idiom
        if how != "default" and self._sampling_meant(caller, module):
            return  # Monte Carlo dropout: training on at evaluation time on purpose
        self.rec.emit_aside(ev.dropout_default(
            fn=fn, p=p, cls=type(module).__name__, name=self._name(module, frame),
            grad=torch.is_grad_enabled(), how=how), self.rec.finder.location(caller))

    def _switched_off(self, fn: str, args, kwargs, caller) -> None:
        """A grad-enabled call with the flag false from a module whose flag was true in train
        mode: that module runs in eval mode, its dropout off. The mode watcher records the
        forward as one of a dropout layer in eval mode (train-in-eval-mode judges it)."""
        try:
            frame, module = self._module_of(caller)
            if module is None or module.training:
                return
            x = args[0] if args else kwargs.get("input")
            self.modes.functional_forward(module, x, frame)
        except Exception as exc:
            self.rec.internal_error(f"F.{fn}", exc)

    def _sampling_meant(self, caller, module) -> bool:
        """Does anything around the call say that dropout at evaluation time is meant?"""
        found = words(type(module).__name__)
        found |= words(linecache.getline(caller.f_code.co_filename, caller.f_lineno))
        for n, frame in enumerate(self.rec.finder.user_frames(caller)):
            if n >= 12:
                break
            found |= words(frame.f_code.co_name)
            if n:  # the lines that called the module: `preds = [mc_forward(x) for _ in ...]`
                found |= words(linecache.getline(frame.f_code.co_filename, frame.f_lineno))
            owner = frame.f_locals.get("self") if frame.f_code.co_argcount else None
            if owner is not None:
                found |= words(type(owner).__name__)
        return not found.isdisjoint(MC_WORDS)

    def _module_of(self, frame):
        """The innermost frame, from ``frame`` up, that runs a method of an ``nn.Module`` (the
        user's ``forward`` calling ``F.dropout``, or the forward a helper was called from), and
        that module; (None, None) outside any."""
        method, Module = self._method, torch.nn.Module
        for _ in range(_MAX_FRAMES):
            if frame is None:
                break
            code = frame.f_code
            is_method = method.get(id(code))
            if is_method is None:
                self._codes[id(code)] = code  # keeps its id its own while it is a key
                is_method = method[id(code)] = code.co_argcount > 0 and code.co_varnames[0] == "self"
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
            if id(f.f_code) in _CALL_CODES:
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
        for name, default in FUNCTIONAL.items():
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name, default))
        for name in TORCH:
            original = getattr(torch, name, None)
            if original is not None:
                patcher.patch(torch, name, self._wrap(original, f"torch.{name}", None))
        original = getattr(F, SDPA, None)
        if original is not None:
            patcher.patch(F, SDPA, self._wrap(original, SDPA, None, sdpa=True))
