"""Per-class weights applied by hand to a per-sample loss, that grow with the classes'
frequency (class-weights-inverted, by hand).

Class-balanced and focal losses are often written without ``weight=``: the per-sample
cross-entropy (``reduction='none'``) multiplied by ``w[labels]``, a table of one weight per
class looked up by each sample's label, perhaps next to a focal factor
(``(w[y] * (1 - p_t) ** gamma * ce).mean()``). The table is meant as the inverse of each
class's frequency (or its effective number, ``(1 - beta) / (1 - beta ** n)``); computed upside
down (``counts / counts.sum()``, ``(1 - beta ** n) / (1 - beta)``) the frequent classes weigh
most and the rare ones are all but ignored. Nothing fails and the loss falls.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for multiplications one of whose operands comes, through
scaling nodes only (``easyweight._loss_below``), from an unreduced ``cross_entropy`` /
``nll_loss``; the other operand, or a factor of it through at most ``_DEPTH`` further
multiplications, is a tensor without gradient with one value per sample. Kept when that factor
is one value per class (the same within every target class seen, distinct across two or more)
and those values rank the classes as their counts in the targets do (``loss_inputs.
_inverted_weights``: the most frequent class at least 3 times the rarest, the largest weight at
least twice the smallest). One ``class_weights`` aside with ``by_hand`` per backward line, at
most once (loc: the backward's line; the rule finds the table's statement in the source).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .easyweight import _loss_below
from .graphpaths import post_order, saved
from .loss_inputs import _inverted_weights
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 3  # multiplications followed down the weight's side for a factor without gradient
_SAMPLES = 16  # targets needed in one batch to count classes


def _factors(node, depth: int = _DEPTH):
    """The operands without gradient of ``node`` (a multiplication) and of the multiplications
    below its operands with a graph, ``depth`` levels down."""
    if node is None or type(node).__name__ != "MulBackward0" or depth < 0:
        return
    parents = [n for n, _ in node.next_functions]
    if len(parents) != 2:
        return
    for i, parent in enumerate(parents):
        if parent is None:
            value = saved(node, "_saved_self" if i == 0 else "_saved_other")
            if isinstance(value, torch.Tensor):
                yield value
        else:
            yield from _factors(parent, depth - 1)


def per_class_values(weight: torch.Tensor, target: torch.Tensor, classes: int):
    """``(counts, weights)`` per class when ``weight`` (one value per sample) is one value per
    target class, else None. Classes absent from the targets get weight 1 and count 0."""
    w = weight.detach().reshape(-1).double()
    t = target.detach().reshape(-1)
    if w.numel() != t.numel() or t.is_floating_point() or not bool(torch.isfinite(w).all()):
        return None
    keep = (t >= 0) & (t < classes)
    w, t = w[keep], t[keep]
    if t.numel() < _SAMPLES:
        return None
    counts = torch.bincount(t, minlength=classes)[:classes].double()
    low = torch.full((classes,), float("inf"), dtype=torch.float64).scatter_reduce(0, t, w, "amin")
    high = torch.full((classes,), float("-inf"), dtype=torch.float64).scatter_reduce(0, t, w, "amax")
    present = counts > 0
    if int(present.sum()) < 2:
        return None
    lo, hi = low[present], high[present]
    if bool(((hi - lo).abs() > 1e-6 * hi.abs().clamp(min=1e-12)).any()):
        return None  # not constant within a class: per-sample weights, not a class table
    weights = torch.ones(classes, dtype=torch.float64)
    weights[present] = lo
    return counts, weights


class HandWeightWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._windows = 0
        self._told = False

    def install(self, patcher) -> None:
        """Nothing to patch: the graph is read at the first backwards."""

    def describe_loss(self, tensors) -> dict:
        if self._windows >= _WINDOWS or self._told:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            return {}
        self._windows += 1
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("class weights applied by hand", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ != "MulBackward0":
                    continue
                found = self._inverted(node)
                if found is None:
                    continue
                self._told = True
                self.rec.emit_aside(ev.class_weights(fn="cross_entropy", by_hand=True, **found),
                                    self.rec.here())
                return

    @staticmethod
    def _inverted(node):
        parents = [n for n, _ in node.next_functions]
        if len(parents) != 2:
            return None
        below = [_loss_below(p) if p is not None else None for p in parents]
        if (below[0] is None) == (below[1] is None):
            return None
        side = 0 if below[0] is not None else 1
        loss = below[side]
        if type(loss).__name__ != "NllLossBackward0":
            return None
        x, target = saved(loss, "_saved_self"), saved(loss, "_saved_target")
        if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor) \
                or x.dim() != 2 or target.dim() != 1 or x.is_cuda:
            return None
        if parents[1 - side] is None:
            value = saved(node, "_saved_other" if side == 0 else "_saved_self")
            candidates = [value] if isinstance(value, torch.Tensor) else []
        else:
            candidates = list(_factors(parents[1 - side]))
        for weight in candidates:
            if weight.is_cuda or not weight.is_floating_point() or weight.numel() != target.numel():
                continue
            table = per_class_values(weight, target, int(x.shape[1]))
            if table is None:
                continue
            found = _inverted_weights("cross_entropy", *table)
            if found is not None:
                return found
        return None
