"""A per-element classification loss multiplied by a weight that falls as the loss rises
(easy-examples-upweighted).

A focal loss multiplies each element's cross-entropy by ``(1 - p_t) ** gamma``: the better the
model already predicts an element, the less it counts, so the many easy negatives of a dense
detector stop drowning the rare hard ones. Written ``p_t ** gamma`` (or with ``p_t`` built from
the wrong side of the target, ``p * (1 - t) + (1 - p) * t``), the factor does the opposite: the
elements the model gets right weigh most, the hard ones least, and training pulls toward what
it already knows. Nothing fails and the loss falls.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for multiplications (``MulBackward0``) one of whose operands
comes, through views and constant or gradient-free factors only, from an unreduced
classification loss (``binary_cross_entropy_with_logits``, ``binary_cross_entropy``,
``cross_entropy``/``nll_loss`` with ``reduction='none'``), and whose other operand, of as many
elements, has a graph of its own (a factor computed from the predictions, as a focal factor
is). The loss's elements are recomputed from its node's saved input and target; within each
group of elements sharing one target value (so that a per-class ``alpha`` weighs nothing) of
``_GROUP`` elements or more, the weight's rank correlation with the loss. One ``easy_weighted``
aside event per loss kind and shape when the correlation, averaged over the groups, is below
``_RHO`` (loc: the backward's line; the rule finds the multiplication in the source).

Silent: a focal factor that grows with the loss (``(1 - p_t) ** gamma``, mmdetection's
``pt.pow(gamma)`` with ``pt = 1 - p_t``, CenterNet's ``pred ** 2`` on the negatives); a
per-class ``alpha`` or a 0/1 mask (constant within a target's group, or few values); a weight
without a graph (a self-paced or small-loss weighting detached on purpose); soft targets (a
quality focal loss's IoU targets: no group is large enough).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import events as ev
from .graphpaths import post_order, saved, signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 4  # nodes followed from a multiplication's operand down to the loss node
_GROUP = 16  # elements of one target value needed to rank a weight within it
_DISTINCT = 8  # distinct weights within a group: fewer is a mask or a per-class constant
_RHO = -0.9  # mean rank correlation of weight and loss at or below which the weight is inverted
_LOSSES = {"BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
           "BinaryCrossEntropyBackward0": "binary_cross_entropy",
           "NllLossBackward0": "cross_entropy", "NllLoss2DBackward0": "cross_entropy"}
# between the multiplication and the loss node: element order and values' ranks kept
_THROUGH = ("MulBackward0", "DivBackward0", "ViewBackward0", "ReshapeAliasBackward0",
            "UnsafeViewBackward0", "SqueezeBackward", "UnsqueezeBackward", "CloneBackward0",
            "ToCopyBackward0")


def _loss_below(node, depth: int = _DEPTH):
    """The unreduced classification loss node ``node`` is, or comes from through element-order
    keeping nodes, else None."""
    for _ in range(depth + 1):
        if node is None:
            return None
        name = type(node).__name__
        if name in _LOSSES:
            reduction = saved(node, "_saved_reduction")
            return node if reduction == 0 else None
        if not name.startswith(_THROUGH):
            return None
        # a scaling node: follow its one operand with a graph (the other is a constant)
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:
            return None
        node = parents[0]
    return None


def _elements(node) -> torch.Tensor | None:
    """(losses, targets), both flat, of an unreduced loss node, from its saved tensors."""
    name = type(node).__name__
    x, target = saved(node, "_saved_self"), saved(node, "_saved_target")
    if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor):
        return None
    weight = saved(node, "_saved_weight")
    weight = weight if isinstance(weight, torch.Tensor) else None
    with torch.no_grad():
        if name == "BinaryCrossEntropyWithLogitsBackward0":
            pos = saved(node, "_saved_pos_weight")
            pos = pos if isinstance(pos, torch.Tensor) else None
            loss = F.binary_cross_entropy_with_logits(x, target, weight, reduction="none",
                                                      pos_weight=pos)
        elif name == "BinaryCrossEntropyBackward0":
            loss = F.binary_cross_entropy(x, target, weight, reduction="none")
        else:
            ignore = saved(node, "_saved_ignore_index")
            loss = F.nll_loss(x, target, weight, reduction="none",
                              ignore_index=signed(ignore) if isinstance(ignore, int) else -100)
    return loss.detach().reshape(-1).double(), target.detach().reshape(-1)


def _ranks(v: torch.Tensor) -> torch.Tensor:
    return v.argsort().argsort().double()


def weight_loss_correlation(weight: torch.Tensor, loss: torch.Tensor,
                            target: torch.Tensor) -> tuple[float, int, int] | None:
    """``(mean rank correlation, groups, elements)`` of a weight with the loss it multiplies,
    within the groups of elements sharing one target value; None when no group can be ranked."""
    w = weight.detach().reshape(-1).double()
    if w.numel() != loss.numel() or target.numel() != loss.numel():
        return None
    values, inverse, counts = torch.unique(target, return_inverse=True, return_counts=True)
    total, size, groups = 0.0, 0, 0
    for g in range(len(values)):
        if int(counts[g]) < _GROUP:
            continue
        member = inverse == g
        wg, lg = w[member], loss[member]
        if not (torch.isfinite(wg).all() and torch.isfinite(lg).all()):
            continue
        if torch.unique(wg).numel() < _DISTINCT or torch.unique(lg).numel() < _DISTINCT:
            continue
        rw, rl = _ranks(wg), _ranks(lg)
        rw, rl = rw - rw.mean(), rl - rl.mean()
        denominator = float((rw.norm() * rl.norm()))
        if denominator == 0.0:
            continue
        rho = float((rw * rl).sum()) / denominator
        total += rho * len(wg)
        size += len(wg)
        groups += 1
    if size == 0:
        return None
    return total / size, groups, size


class EasyWeightWatcher:
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
            self.rec.internal_error("loss weights against the loss", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ != "MulBackward0":
                    continue
                found = self._inverted(node)
                if found is None:
                    continue
                fn, shape, rho, groups, size = found
                key = (fn, shape)
                if key in self._told:
                    continue
                self._told.add(key)
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.easy_weighted(fn=fn, shape=list(shape), rho=round(rho, 3),
                                                     groups=groups, elements=size), loc)

    def _inverted(self, node):
        parents = [n for n, _ in node.next_functions]
        if len(parents) != 2:
            return None
        below = [_loss_below(p) for p in parents]
        if (below[0] is None) == (below[1] is None):
            return None  # no loss operand, or the loss times itself
        side = 0 if below[0] is not None else 1
        if parents[1 - side] is None:
            return None  # a weight without a graph: detached on purpose
        weight = saved(node, "_saved_other" if side == 0 else "_saved_self")
        if not isinstance(weight, torch.Tensor) or weight.is_cuda or not weight.is_floating_point():
            return None
        elements = _elements(below[side])
        if elements is None:
            return None
        loss, target = elements
        if target.is_floating_point() and not torch.equal(target, target.round()):
            return None  # soft targets: no group of one target value
        measured = weight_loss_correlation(weight, loss, target)
        if measured is None or measured[0] > _RHO:
            return None
        rho, groups, size = measured
        return _LOSSES[type(below[side]).__name__], tuple(weight.shape), rho, groups, size
