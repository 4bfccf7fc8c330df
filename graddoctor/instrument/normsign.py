"""A normaliser that changes sign: a quotient whose denominator is a sum of products of
activations (linear attention's ``q . sum(k)``, a ``w / w.sum(-1)`` weighting) holding negative
and positive values (normaliser-changes-sign).

Linear attention (Katharopoulos et al.; Performer, cosFormer, RetNet's normalised form) divides
``phi(q) . sum_j phi(k_j) v_j`` by ``phi(q) . sum_j phi(k_j)``: a weighted mean, which needs the
feature map ``phi`` to be positive (``elu(x) + 1``, ``relu``, ``exp``). With a feature map that
can be negative (``elu(x)`` without the ``+ 1``, the raw projections, ``tanh``) the normaliser is
a sum of signed terms: it crosses zero, the quotient explodes near it and flips sign past it, and
training quietly degrades (or ends in NaN much later). The same holds for any weights normalised
by their own sum (``w / w.sum(-1, keepdim=True)``) that are not positive.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for ``DivBackward0`` (its saved denominator ``other``)
and ``ReciprocalBackward0`` (its saved result, of the denominator's sign) whose denominator has
a graph made by a summing op (``BmmBackward0``, ``MmBackward0``, ``SumBackward*``,
``CumsumBackward0``, through views, permutes and added constants such as an ``eps``). A CPU
denominator of 16 values or more with at least 5 % of each sign is reported once per op and
shape, with the activation found below the sum (``elu``, ``tanh``...; none: the raw
projections), in an aside ``normaliser_sign`` (loc: the backward's line; the rule finds the
feature map in the source). Values are read once per candidate: two comparisons.

Silent: denominators of one sign (softmax's sums of exponentials, norms, ``elu + 1`` features,
``relu`` features plus an eps, counts); quotients by a tensor without graph (a target, a
constant); a denominator made by no sum (a learned temperature, a difference); a soft
dice/IoU ratio on a layer's raw scores (``overlapscores.raw_overlap``: one bug, reported there).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved
from .losswindow import LossWindow
from .overlapscores import raw_overlap
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 6  # nodes followed from the denominator to its sum, and from the sum to an activation
_MIN_VALUES = 16
_SHARE = 0.05  # share of each sign a denominator must hold
_SUMS = ("BmmBackward0", "MmBackward0", "SumBackward0", "SumBackward1", "CumsumBackward0")
# between the quotient and the sum: shapes and added constants only
_TO_SUM = ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAlias", "PermuteBackward0",
           "TransposeBackward0", "UnsqueezeBackward0", "SqueezeBackward", "ExpandBackward0",
           "AddBackward1", "AddBackward0", "CloneBackward0")
# activations whose range holds negative values, by the name the script calls them with
_SIGNED = {"EluBackward0": "elu", "TanhBackward0": "tanh", "LeakyReluBackward0": "leaky_relu",
           "SiluBackward0": "silu", "GeluBackward0": "gelu", "SeluBackward0": "selu",
           "CeluBackward0": "celu", "HardtanhBackward0": "hardtanh"}
_TO_FEATURE = ("ViewBackward0", "UnsafeViewBackward0", "PermuteBackward0", "TransposeBackward0",
               "UnsqueezeBackward0", "SqueezeBackward", "ExpandBackward0", "CumsumBackward0",
               "UnbindBackward0", "SelectBackward0", "SliceBackward0", "SplitBackward0",
               "CloneBackward0", "MulBackward0", "BmmBackward0")


def _parents(node) -> list:
    return [n for n, _ in getattr(node, "next_functions", ()) if n is not None
            and type(n).__name__ != "AccumulateGrad"]


def _walk(node, through: tuple, found, depth: int = _DEPTH):
    todo, seen = [(node, depth)], set()
    while todo:
        current, left = todo.pop()
        if current is None or id(current) in seen or left < 0:
            continue
        seen.add(id(current))
        if found(current):
            return current
        if type(current).__name__.startswith(through):
            todo += [(p, left - 1) for p in _parents(current)]
    return None


def _denominator(node):
    """``(denominator values, its graph node)`` of a quotient node, else None."""
    name = type(node).__name__
    if name == "DivBackward0":
        other = saved(node, "_saved_other")
        parents = [n for n, _ in node.next_functions]
        below = parents[1] if len(parents) > 1 else None
        return (other, below) if isinstance(other, torch.Tensor) and below is not None else None
    if name == "ReciprocalBackward0":
        result = saved(node, "_saved_result")
        parents = [n for n, _ in node.next_functions]
        below = parents[0] if parents else None
        return (result, below) if isinstance(result, torch.Tensor) and below is not None else None
    return None


class NormaliserSignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.loss_window = LossWindow(rec, _WINDOWS, self.describe_loss)
        self._told: set = set()

    def install(self, patcher) -> None:
        """Nothing to patch: the graph is read at the first backwards."""

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("normaliser sign", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                found = _denominator(node)
                if found is None:
                    continue
                values, below = found
                if type(node).__name__ == "DivBackward0" and raw_overlap(node) is not None:
                    continue  # a dice/IoU on logits: overlap-on-raw-scores names that cause
                if values.device.type != "cpu" or not values.is_floating_point() \
                        or values.numel() < _MIN_VALUES:
                    continue
                summed = _walk(below, _TO_SUM, lambda n: type(n).__name__ in _SUMS)
                if summed is None:
                    continue
                key = (type(node).__name__, tuple(values.shape))
                if key in self._told:
                    continue
                with torch.no_grad():
                    negative = float((values < 0).float().mean())
                    positive = float((values > 0).float().mean())
                if negative < _SHARE or positive < _SHARE:
                    continue
                self._told.add(key)
                feature = next((f for f in (_walk(p, _TO_FEATURE, lambda n: type(n).__name__ in _SIGNED)
                                            for p in _parents(summed)) if f is not None), None)
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.normaliser_sign(
                    op="div" if type(node).__name__ == "DivBackward0" else "reciprocal",
                    sum=type(summed).__name__, shape=[int(s) for s in values.shape],
                    negative=round(negative, 4), positive=round(positive, 4),
                    feature=_SIGNED[type(feature).__name__] if feature is not None else None), loc)
