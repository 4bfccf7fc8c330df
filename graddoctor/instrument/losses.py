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
``loss_broadcast`` aside event, see ``Recorder.emit_aside``), and so is a target that expands
against the prediction along a dim it was sliced down on (``y[:, :1]`` of a ``y`` shaped like
the prediction: one target column for every output).

The same wrapper looks, at the first ``_RANGE_CHECKS`` calls of each function that a gradient
flows through, at what made the prediction: when it is a bounded activation (sigmoid, tanh,
softmax: (0, 1) or (-1, 1); relu, softplus, exp: nothing below 0), seen through value-keeping
operations (reshape, select, cat of like parts), one small reduction says which share of the
targets lies outside that range. A quarter or more is recorded once per call line (an
``output_range`` aside event): the model cannot reach those targets, whatever it learns.

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
from .losscalls import LossCalls
from .recorder import Recorder

NAMES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_MAX_FINE = 1024  # shape pairs remembered (variable lengths must not grow it without bound)
_RANGE_CHECKS = 8  # calls per function whose prediction's range is compared with the targets
_OUTSIDE_SHARE = 0.25  # targets outside the reachable range: at least this share is recorded
_SLACK = 1e-3  # a target at a bound (a clamped 0, a smoothed 1) is reachable
# autograd nodes (by name prefix) whose output lies in a bounded range, and that range
_BOUNDED = (("SigmoidBackward", "sigmoid", 0.0, 1.0), ("TanhBackward", "tanh", -1.0, 1.0),
            ("SoftmaxBackward", "softmax", 0.0, 1.0), ("ReluBackward", "relu", 0.0, math.inf),
            ("SoftplusBackward", "softplus", 0.0, math.inf), ("ExpBackward", "exp", 0.0, math.inf))
# nodes that keep the values they are given (not clamp: it changes the range)
_KEEPING = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
            "TBackward", "Clone", "ToCopy", "Slice", "Select", "Index", "Expand", "Alias",
            "Narrow", "Flatten", "Contiguous", "Cat", "Stack", "Split", "Unbind")
_DEPTH = 12


def bounded_by(node, depth: int = _DEPTH) -> tuple[str, float, float] | None:
    """``(activation, low, high)`` when ``node``'s output is a bounded activation's, seen
    through value-keeping operations (a cat or stack: when all its parts agree), else None."""
    while node is not None and depth > 0:
        name = type(node).__name__
        for prefix, activation, low, high in _BOUNDED:
            if name.startswith(prefix):
                return activation, low, high
        if not name.startswith(_KEEPING):
            return None
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:
            found = {bounded_by(n, depth - 1) for n in parents}
            return found.pop() if len(found) == 1 else None
        node, depth = parents[0], depth - 1
    return None


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


def _narrowed_from(input, target) -> list[int] | None:
    """The shape of the tensor ``target`` is a view of, when the target expands against the
    input only along dims where that tensor has the input's sizes (``y[:, :1]`` of a (N, 3)
    ``y`` against a (N, 3) prediction: the columns the slice dropped are the ones the other
    outputs should be compared with); else None (an ensemble's (N, K) predictions of one
    (N, 1) target made by ``y.unsqueeze(1)`` keeps no wider base)."""
    base = target._base
    if base is None or base.dim() != input.dim() or target.dim() != input.dim():
        return None
    expanded = [d for d, (x, y) in enumerate(zip(input.shape, target.shape)) if x != y]
    if not expanded or any(base.shape[d] != input.shape[d] for d in expanded):
        return None
    return list(base.shape)


class LossShapeWatcher:
    def __init__(self, rec: Recorder, calls: LossCalls | None = None):
        self.rec = rec
        self.calls = calls or LossCalls()  # the other watchers that hear of these calls
        self._done: set = set()  # locations already recorded
        self._fine: set = set()  # (input shape, target shape) pairs that broadcast harmlessly
        self._range_checks: dict[str, int] = {}  # fn -> calls whose targets' range was read
        self._ranged: set = set()  # locations recorded with an output_range event

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec
        signature = inspect.signature(original)

        heard = watcher.calls.heard
        ranging = True  # this function's targets' range is still read (a count that only grows)

        def before(args, kwargs) -> None:
            nonlocal ranging
            input = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            heard(fn, input, target, args, kwargs)
            if ranging:
                try:
                    watcher._range(fn, input, target)
                except Exception as exc:
                    rec.internal_error(f"F.{fn}", exc)
                ranging = watcher._range_checks.get(fn, 0) < _RANGE_CHECKS
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
        narrowed = None
        if shape is not None and shape == a and size_b < size_a:
            narrowed = _narrowed_from(input, target)
        if narrowed is None and (shape is None or math.prod(shape) <= max(size_a, size_b)):
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
            grad=torch.is_grad_enabled() and (input.requires_grad or target.requires_grad),
            narrowed_from=narrowed), loc)

    def _range(self, fn: str, input, target) -> None:
        """An ``output_range`` aside when the prediction comes out of a bounded activation and a
        quarter or more of the targets lie outside its range (see the module docs)."""
        if not (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
                and input.requires_grad and torch.is_grad_enabled()
                and target.is_floating_point() and target.numel() and not target.requires_grad):
            return
        self._range_checks[fn] = self._range_checks.get(fn, 0) + 1
        bound = bounded_by(input.grad_fn)
        if bound is None:
            return
        activation, low, high = bound
        with torch.no_grad():
            t = target.detach().float()
            outside, t_low, t_high = torch.stack([
                ((t < low - _SLACK) | (t > high + _SLACK)).float().mean(), t.min(), t.max()]).tolist()
        if outside < _OUTSIDE_SHARE or not (math.isfinite(t_low) and math.isfinite(t_high)):
            return
        rec = self.rec
        loc = rec.here()
        if loc in self._ranged:
            return
        self._ranged.add(loc)
        rec.emit_aside(ev.output_range(fn=fn, activation=activation, low=low,
                                       high=high if math.isfinite(high) else None,
                                       outside=round(outside, 4), target_low=round(t_low, 4),
                                       target_high=round(t_high, 4)), loc)

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
