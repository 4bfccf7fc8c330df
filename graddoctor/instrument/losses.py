"""Regression losses whose input and target broadcast to a larger shape than either.

``F.mse_loss(pred, y)`` with ``pred`` of shape (N, 1) and ``y`` of shape (N,) compares every
prediction with every target: the loss is the mean of an N×N matrix and training fits the mean
of the batch's targets. torch only prints a UserWarning (for any shape difference, the harmless
ones included).

``mse_loss``, ``l1_loss``, ``smooth_l1_loss`` and ``huber_loss`` in ``torch.nn.functional`` are
patched before the user's script is imported (their ``nn`` modules call them; ``torch.jit.script``
compiles torch's own function, ``__prepare_scriptable__``). Cost per call: one
shape comparison; only different shapes are looked at further (their broadcast, in Python). A
call whose broadcast has more elements than input and target is recorded once per call line (a
``loss_broadcast`` aside event, see ``Recorder.emit_aside``).

torch's UserWarning about the shapes (``stacklevel=2``) names this wrapper's line instead of the
caller's while graddoctor runs; graddoctor's finding names the user's line. Re-issuing it at the
caller would need ``warnings.catch_warnings``, whose filter reset clears every module's
once-per-location registry: a harmless (N, D) / (D,) broadcast would then warn at every step.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from .. import events as ev
from .inlinable import watched
from .recorder import Recorder

NAMES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_MAX_FINE = 1024  # shape pairs remembered (variable lengths must not grow it without bound)


def broadcast_shape(a, b) -> list[int] | None:
    """The shape ``a`` and ``b`` broadcast to, or None when they do not (torch then raises)."""
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return out


class LossShapeWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._done: set = set()  # locations already recorded
        self._fine: set = set()  # (input shape, target shape) pairs that broadcast harmlessly

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec
        signature = inspect.signature(original)

        def before(args, kwargs) -> None:
            input = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            try:
                if input.shape == target.shape:
                    return
            except AttributeError:
                return  # not tensors: torch reports it
            try:
                watcher._check(fn, signature, input, target, args, kwargs)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, signature, input, target, args, kwargs) -> None:
        if not (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)):
            return  # a number, or a mistake torch reports itself
        pair = (input.shape, target.shape)
        if pair in self._fine:
            return  # a harmless broadcast already seen here (every step of a loop repeats it)
        a, b = list(pair[0]), list(pair[1])
        shape = broadcast_shape(a, b)
        size_a, size_b = math.prod(a), math.prod(b)
        if shape is None or math.prod(shape) <= max(size_a, size_b):
            # torch raises for the first; in the second one side only expands (a scalar, a
            # per-feature target): the usual intent
            if len(self._fine) < _MAX_FINE:
                self._fine.add(pair)
            return
        rec = self.rec
        loc = rec.here()
        if loc in self._done:
            return
        self._done.add(loc)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return  # torch reports the bad call
        reduction = bound.get("reduction", "mean")
        if bound.get("size_average") is not None or bound.get("reduce") is not None:
            from torch.nn import _reduction

            reduction = _reduction.legacy_get_string(bound.get("size_average"), bound.get("reduce"),
                                                     emit_warning=False)
        rec.emit_aside(ev.loss_broadcast(
            fn=fn, input_shape=a, target_shape=b, shape=shape,
            reduction=reduction if isinstance(reduction, str) else None,
            grad=torch.is_grad_enabled() and (input.requires_grad or target.requires_grad)), loc)

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
