"""A soft overlap ratio (dice, IoU, Tversky) computed on raw scores instead of probabilities
(overlap-on-raw-scores).

A soft dice loss is ``1 - 2 * sum(p * t) / (sum(p) + sum(t))`` over probabilities ``p`` in
[0, 1] (a sigmoid's or a softmax's output) and a 0/1 target mask ``t``: the ratio is 1 only
where the prediction covers the mask and nothing else. Given the logits themselves (the
``sigmoid`` forgotten in the loss function, or the mask head's raw output handed to a dice that
expects probabilities), the "overlap" is a sum of signed numbers: negative scores shrink the
denominator, the ratio leaves [0, 1] and is maximised by pushing scores to large magnitudes
rather than matching the mask. Nothing fails; the dice term trains against the other terms.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for divisions (``DivBackward0``) whose numerator, within
``_DEPTH`` nodes, holds a multiplication (``MulBackward0``) of a tensor with a graph by a
tensor without one that holds only 0 and 1 (the mask, ``_MIN_VALUES`` values or more), and
whose denominator, within ``_DEPTH`` nodes, reads the same scores (the multiplication's graph
operand's node: the sum of the prediction). When those scores are, through views, indexing and
concatenation only, a layer's signed output (a linear layer, a matrix product, a convolution, a
sum: what a sigmoid or softmax was meant to squash), one ``overlap_scores`` aside event per
shape (loc: the backward's
line; the rule finds the function that computes the overlap in the source).

Silent: the same ratio on a sigmoid's or softmax's output, a ReLU's, a clamp's (nothing below
0), or scores of unknown making; a ratio whose
denominator does not read the multiplied scores (a weighted mean: ``sum(w * x) / sum(w)``
divides by the weights, not the scores); soft targets (a mask of more than two values); a
product with no 0/1 factor (a cosine similarity, an attention-weighted average).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 6  # nodes below a division's operand searched for the product and the scores' sum
_MIN_VALUES = 16  # values of the 0/1 mask, at least: a few scalars are no mask


def _below(node, depth: int = _DEPTH) -> set:
    """The nodes within ``depth`` levels below ``node`` (itself included)."""
    level, seen = [node], {node}
    for _ in range(depth):
        nxt = []
        for n in level:
            for child, _ in getattr(n, "next_functions", ()):
                if child is not None and child not in seen:
                    seen.add(child)
                    nxt.append(child)
        level = nxt
    return seen


def _is_mask(t) -> bool:
    if not isinstance(t, torch.Tensor) or t.requires_grad or t.is_cuda or t.numel() < _MIN_VALUES \
            or not (t.is_floating_point() or t.dtype == torch.bool):
        return False
    with torch.no_grad():
        flat = t.detach().reshape(-1).float()
        return bool(((flat == 0) | (flat == 1)).all()) and bool((flat == 1).any())


# between the scores' producer and the product: element values kept
_THROUGH = ("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "PermuteBackward0",
            "TransposeBackward0", "SqueezeBackward", "UnsqueezeBackward", "CloneBackward0",
            "ToCopyBackward0", "SliceBackward0", "SelectBackward0", "IndexBackward0",
            "ExpandBackward0", "CatBackward0", "StackBackward0")
# producers whose output is signed and unbounded: a layer's raw output
_SIGNED = {"AddmmBackward0": "linear", "MmBackward0": "matmul", "BmmBackward0": "matmul",
           "ConvolutionBackward0": "convolution", "LinearBackward0": "linear",
           "AddBackward0": "sum", "SubBackward0": "difference", "NativeLayerNormBackward0": "layer norm",
           "NativeBatchNormBackward0": "batch norm"}


_SQUASHES = ("SigmoidBackward", "TanhBackward", "SoftmaxBackward", "ReluBackward", "SoftplusBackward",
             "ExpBackward", "ClampBackward", "ClampMinBackward", "HardtanhBackward", "AbsBackward")


def _squashed_term(node, depth: int = 6) -> bool:
    """Whether a term of a sum with a graph comes, through value-keeping nodes and products
    or quotients with a constant, out of a bounded activation."""
    stack = [(n, depth) for n, _ in node.next_functions if n is not None]
    while stack:
        cur, left = stack.pop()
        name = type(cur).__name__
        if name.startswith(_SQUASHES):
            return True
        if left <= 0 or not (name.startswith(_THROUGH) or name.startswith(("MulBackward", "DivBackward"))):
            continue
        parents = [n for n, _ in cur.next_functions if n is not None]
        if len(parents) == 1:
            stack.append((parents[0], left - 1))
    return False


def producer(node, depth: int = _DEPTH) -> str | None:
    """What made the scores ``node`` carries, through value-keeping nodes: "linear", "matmul",
    "convolution"... for a layer's signed output; None for anything else (a sigmoid, a softmax,
    a ReLU, a clamp: bounded below by 0, or unknown)."""
    for _ in range(depth + 1):
        if node is None:
            return None
        name = type(node).__name__
        if name in ("AddBackward0", "SubBackward0") and _squashed_term(node):
            return None  # 0.5 * tanh(x) + 0.5: a bounded activation moved into [0, 1]
        if name in _SIGNED:
            return _SIGNED[name]
        if not name.startswith(_THROUGH):
            return None
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:
            return None
        node = parents[0]
    return None


def masked_scores(mul):
    """``(scores node, mask)`` of a ``MulBackward0`` of a tensor with a graph by a 0/1 mask
    without one, else None."""
    parents = [n for n, _ in mul.next_functions]
    if len(parents) != 2 or (parents[0] is None) == (parents[1] is None):
        return None
    side = 0 if parents[0] is not None else 1
    mask = saved(mul, "_saved_other" if side == 0 else "_saved_self")
    if not _is_mask(mask):
        return None
    return parents[side], mask


def raw_overlap(div):
    """``(what made the scores, the mask's shape)`` for a division whose numerator multiplies
    scores by a 0/1 mask and whose denominator reads the same scores, when a layer's signed
    output is what those scores are; else None."""
    parents = [n for n, _ in div.next_functions]
    if len(parents) != 2 or parents[0] is None or parents[1] is None:
        return None
    denominator = _below(parents[1])
    for node in _below(parents[0]):
        if type(node).__name__ != "MulBackward0":
            continue
        found = masked_scores(node)
        if found is None:
            continue
        scores_node, mask = found
        if scores_node not in denominator:
            continue
        made = producer(scores_node)
        if made is not None:
            return made, tuple(int(d) for d in mask.shape)
    return None


class OverlapScoresWatcher:
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
            self.rec.internal_error("overlap ratios on raw scores", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ != "DivBackward0":
                    continue
                found = raw_overlap(node)
                if found is None:
                    continue
                made, shape = found
                if shape in self._told:
                    continue
                self._told.add(shape)
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.overlap_scores(shape=list(shape), producer=made), loc)
