"""A padding mask that keeps the padding (mask-keeps-padding).

Masked pooling and masked per-token losses multiply by a 0/1 mask of the real tokens
(``mask = arange(T) < lengths[:, None]``, ``tokens != PAD``) or fill the padding
(``h.masked_fill(tokens == PAD, 0)``). Written with the comparison the other way round
(``>=``, ``==``), the mask keeps exactly the padded positions: a mean-pooled sentence vector is
the average of the padding's features, a masked loss trains only the padding, and every real
token is left out. Nothing fails, the shapes agree, the loss still falls a little.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), while the attention
mask watcher holds padded token batches embedded just before (``padded_token_batches``: CPU
(batch, length) ids with the fill id in two rows or more), the loss's graph is walked (at most
``_NODES`` nodes) for products (``MulBackward0``) with an operand without graph and for
``MaskedFillBackward0`` nodes. The operand (the fill's mask) holds only 0 and 1 and, its size-1
axes squeezed, has a token batch's (batch, length) shape: a product whose mask is 1 at exactly
the fill positions, or a fill whose mask is True at exactly the other positions, is recorded as
one ``padding_kept`` aside event per op and shape (loc: the backward's line; the rule finds the
comparison in the source).

Silent: the mask of the real tokens (``<``, ``!=``), a fill of the padding, a mask that differs
from the padding anywhere (a causal or random mask), token batches without padding in two rows.
Cost: nothing after the first ``_WINDOWS`` backwards, nothing at all without a padded token
batch; a graph walk and one comparison per candidate operand at those backwards.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward


def _as_kept(mask, op: str, shape: tuple) -> torch.Tensor | None:
    """The (batch, length) boolean positions a 0/1 operand keeps (a product's 1s, a fill's
    False), or None when it is no such mask of that shape."""
    if not isinstance(mask, torch.Tensor) or mask.device.type != "cpu" or mask.requires_grad:
        return None
    if [s for s in mask.shape if s != 1] != [s for s in shape if s != 1] or mask.dim() < 2 \
            or tuple(mask.shape[:2]) != shape:
        return None
    flat = mask.detach().reshape(shape)
    if flat.dtype != torch.bool:
        if not bool(((flat == 0) | (flat == 1)).all()):
            return None
        flat = flat != 0
    return ~flat if op == "masked_fill" else flat


class PaddingMaskWatcher:
    def __init__(self, rec: Recorder, attention_masks):
        self.rec = rec
        self._attention_masks = attention_masks
        self.loss_window = LossWindow(rec, _WINDOWS, self.describe_loss)
        self._told: set = set()

    def install(self, patcher) -> None:
        """Nothing to patch: the graph is read at the first backwards."""

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            batches = self._attention_masks.padded_token_batches()
            if batches:
                self._look(tensors, batches)
        except Exception as exc:
            self.rec.internal_error("padding masks against the token batches", exc)
        return {}

    def _look(self, tensors, batches) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        shapes = {tuple(tokens.shape): (tokens, fill) for tokens, fill in batches}
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node, op, mask in _masks(post_order(root, _NODES) or ()):
                for shape, (tokens, fill) in shapes.items():
                    if (op, shape) in self._told:
                        continue
                    with torch.no_grad():
                        kept = _as_kept(mask, op, shape)
                        if kept is None:
                            continue
                        padding = tokens == fill
                        if not bool(kept.any()) or not bool(torch.equal(kept, padding)):
                            continue
                    self._told.add((op, shape))
                    if loc is None:
                        loc = self.rec.here()
                    self.rec.emit_aside(ev.padding_kept(
                        op=op, fill=int(fill), rows=int(shape[0]), shape=list(shape),
                        kept=round(float(kept.float().mean()), 4)), loc)


def _masks(nodes):
    """``(node, op, mask)``: each product's operand without graph, each fill's mask."""
    for node in nodes:
        name = type(node).__name__
        if name == "MulBackward0":
            parents = [n for n, _ in node.next_functions]
            if len(parents) != 2 or (parents[0] is None) == (parents[1] is None):
                continue
            side = 0 if parents[0] is not None else 1
            yield node, "mul", saved(node, "_saved_other" if side == 0 else "_saved_self")
        elif name == "MaskedFillBackward0":
            yield node, "masked_fill", saved(node, "_saved_mask")
