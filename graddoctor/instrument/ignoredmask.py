"""A soft-set loss term (dice, IoU, Tversky) masked to exactly the pixels the cross-entropy
ignores (loss-on-ignored-pixels).

Segmentation code marks unlabeled pixels (a border, a void region) with ``ignore_index`` (255)
and hands the same value to ``cross_entropy``; a dice loss written by hand must then leave
those pixels out itself: ``valid = (target != 255)``, ``probs * valid``. Written
``target == 255``, the mask keeps only the unlabeled pixels: the dice term is computed on the
void border, against whatever class the clamped label gives it, and every labeled pixel is left
out of it. The cross-entropy still trains, so the loss falls; the dice term pulls the
predictions of the border toward an arbitrary class and adds nothing where the objects are.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for ``NllLossBackward0``/``NllLoss2DBackward0`` nodes whose
saved integer target holds their ``ignore_index`` at some pixels, at most half of them; and for
multiplications (``MulBackward0``) of a tensor coming from a ``softmax``/``sigmoid`` (through
views) by a tensor without a graph that holds only 0 and 1 and, once its size-1 axes are
squeezed, has the target's shape, whose product then meets the labels (multiplied, through
views, by another tensor without a graph: a soft-set intersection ``(probs * onehot).sum()``):
when the mask is 1 at exactly the ignored pixels, one
``ignored_mask`` aside event per target shape (loc: the backward's line; the rule finds the
comparison in the source).

Silent: the mask of the labeled pixels (``!=``, ``1 - ignored``); a term over the ignored pixels
that is no soft-set term on the probabilities (an entropy or pseudo-label loss on the unlabeled
pixels goes through a log, a consistency between two predictions there compares them with each
other: neither multiplies the masked probabilities by the labels); a mask that differs from the
ignored pixels anywhere.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 4  # nodes followed from a multiplication's operand down to a softmax or sigmoid
_SHARE = 0.5  # the ignored pixels a target may hold at most (a minority: a border, a void)
_NLL = ("NllLossBackward0", "NllLoss2DBackward0")
_PROBS = ("SoftmaxBackward0", "SigmoidBackward0")
_THROUGH = ("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "PermuteBackward0",
            "SqueezeBackward", "UnsqueezeBackward", "CloneBackward0", "ToCopyBackward0",
            "SliceBackward0", "SelectBackward0")


def _probabilities_below(node, depth: int = _DEPTH) -> bool:
    for _ in range(depth + 1):
        if node is None:
            return False
        name = type(node).__name__
        if name in _PROBS:
            return True
        if not name.startswith(_THROUGH):
            return False
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:
            return False
        node = parents[0]
    return False


def ignored_targets(nodes) -> list[tuple[torch.Tensor, int]]:
    """``(ignored pixels, ignore_index)`` of the cross-entropy nodes whose target holds its
    ignore_index at some pixels, at most ``_SHARE`` of them."""
    out = []
    for node in nodes:
        if type(node).__name__ not in _NLL:
            continue
        target, ignore = saved(node, "_saved_target"), saved(node, "_saved_ignore_index")
        if not isinstance(target, torch.Tensor) or not isinstance(ignore, int) \
                or target.is_floating_point() or target.is_cuda or target.dim() < 2:
            continue
        ignore = signed(ignore)
        ignored = target == ignore
        count = int(ignored.sum())
        if 0 < count <= _SHARE * target.numel():
            out.append((ignored, ignore))
    return out


def selects_ignored(mask: torch.Tensor, ignored: torch.Tensor) -> bool:
    """Whether a 0/1 mask is 1 at exactly the ignored pixels (size-1 axes squeezed)."""
    squeezed = [s for s in mask.shape if s != 1]
    if squeezed != [s for s in ignored.shape if s != 1]:
        return False
    flat = mask.detach().reshape(-1)
    if flat.dtype != torch.bool:
        if not bool(((flat == 0) | (flat == 1)).all()):
            return False
        flat = flat != 0
    return bool(torch.equal(flat, ignored.reshape(-1)))


def _meets_labels(node, consumers: dict, depth: int = _DEPTH) -> bool:
    """Whether masked probabilities meet the labels the way a soft-set term's intersection does:
    multiplied (through views) by a tensor without a graph (``(probs * onehot).sum()``, a
    Tversky term's ``probs * (1 - onehot)``). A consistency between two predictions on the
    unlabeled pixels (``(p1 - p2.detach()) ** 2``) or an entropy (``p * log p``) does not."""
    level = [node]
    for _ in range(depth):
        following = []
        for item in level:
            for user in consumers.get(item, ()):
                name = type(user).__name__
                if name == "MulBackward0" and sum(n is None for n, _ in user.next_functions) == 1:
                    return True
                if name.startswith(_THROUGH):
                    following.append(user)
        level = following
    return False


class IgnoredMaskWatcher:
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
            self.rec.internal_error("loss masks against the ignored pixels", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES) or ()
            targets = ignored_targets(nodes)
            if not targets:
                continue
            consumers: dict = {}
            for node in nodes:
                for child, _ in node.next_functions:
                    if child is not None:
                        consumers.setdefault(child, []).append(node)
            for node in nodes:
                if type(node).__name__ != "MulBackward0":
                    continue
                parents = [n for n, _ in node.next_functions]
                if len(parents) != 2 or (parents[0] is None) == (parents[1] is None):
                    continue
                side = 0 if parents[0] is not None else 1
                if not _probabilities_below(parents[side]):
                    continue
                mask = saved(node, "_saved_other" if side == 0 else "_saved_self")
                if not isinstance(mask, torch.Tensor) or mask.is_cuda:
                    continue
                if not _meets_labels(node, consumers):
                    continue  # no soft-set term: a consistency or entropy on the unlabeled pixels
                for ignored, ignore in targets:
                    if not selects_ignored(mask, ignored):
                        continue
                    key = tuple(ignored.shape)
                    if key in self._told:
                        continue
                    self._told.add(key)
                    if loc is None:
                        loc = self.rec.here()
                    self.rec.emit_aside(ev.ignored_mask(
                        ignore_index=ignore, shape=list(ignored.shape),
                        ignored=int(ignored.sum()), pixels=ignored.numel()), loc)
