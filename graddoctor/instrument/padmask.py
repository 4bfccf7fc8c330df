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

The same walk finds a mean over the token axis that pools the padding in with the tokens
(``h.mean(1)`` of an encoder's output, ``last_hidden_state.mean(dim=1)``): a ``MeanBackward1``
over exactly one axis of a tensor of three axes or more, that axis as long as a padded token
batch and another as long as its rows, whose value a layer (a matrix product or a convolution)
reads on the way to the loss, and below which that token batch's own lookup
(``EmbeddingBackward0``, its saved ids equal to the batch) is reached with no 0/1 mask of the
batch's shape multiplied, filled or selected in between. A mean over a lookup and nothing but
zero-preserving ops (views, transposes, dropout, products) of an embedding whose
``padding_idx`` is the fill averages zeros: the sentence vector is only scaled by its length,
left alone. One ``padding_pooled`` aside event per shape (loc: the backward's line).
Cost: nothing after the first ``_WINDOWS`` backwards, nothing at all without a padded token
batch; a graph walk and one comparison per candidate operand at those backwards.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims, signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
# nodes that read a pooled vector as a layer does (on the way from a mean to the loss)
_LAYERS = frozenset({"AddmmBackward0", "MmBackward0", "BmmBackward0", "MvBackward0",
                     "ConvolutionBackward0", "LinearBackward0"})
# ops that keep a zero vector zero: a lookup of the padding_idx row stays 0 through them
_ZERO_KEEPING = frozenset({
    "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "TransposeBackward0",
    "PermuteBackward0", "CloneBackward0", "ToCopyBackward0", "AliasBackward0",
    "MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1", "NativeDropoutBackward0",
    "ExpandBackward0", "SliceBackward0", "UnsqueezeBackward0", "SqueezeBackward0",
    "SqueezeBackward1", "SelectBackward0"})


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
            order = post_order(root, _NODES) or ()
            for node, op, mask in _masks(order):
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
            for shape, fill, padded, layout in _pooled_over_padding(order, shapes):
                if ("pooled", shape) in self._told:
                    continue
                self._told.add(("pooled", shape))
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.padding_pooled(
                    fill=int(fill), rows=int(shape[0]), shape=list(shape), padded=padded,
                    axis=layout), loc)


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


def _under_layers(order: list) -> set:
    """The nodes of ``order`` (a post-order: each node after its inputs) whose value some layer
    reads on the way to the root."""
    below: set = set()
    for node in reversed(order):  # each node before its inputs
        if node in below or type(node).__name__ in _LAYERS:
            for child, _ in node.next_functions:
                if child is not None:
                    below.add(child)
    return below


def _mask_between(nodes, shape: tuple) -> bool:
    """Whether one of ``nodes`` multiplies, fills or selects with a 0/1 mask of the token
    batch's (batch, length) shape (either layout)."""
    flipped = (shape[1], shape[0])
    for node in nodes:
        name = type(node).__name__
        if name == "IndexBackward0" or name == "MaskedSelectBackward0":
            return True
        if name == "WhereBackward0":
            mask, op = saved(node, "_saved_condition"), "masked_fill"
        elif name == "MulBackward0":
            parents = [n for n, _ in node.next_functions]
            if len(parents) != 2 or (parents[0] is None) == (parents[1] is None):
                continue
            mask, op = saved(node, "_saved_other" if parents[0] is not None else "_saved_self"), "mul"
        elif name == "MaskedFillBackward0":
            mask, op = saved(node, "_saved_mask"), "masked_fill"
        else:
            continue
        if _as_kept(mask, op, shape) is not None or _as_kept(mask, op, flipped) is not None:
            return True
    return False


def _pooled_over_padding(order: list, shapes: dict):
    """``(shape, fill, padded share, "batch-first" | "length-first")`` for each mean over the
    token axis of a tensor that holds a padded token batch's positions unmasked (module
    docstring)."""
    means = [n for n in order if type(n).__name__ == "MeanBackward1"]
    if not means:
        return
    layered = _under_layers(order)
    for mean in means:
        if mean not in layered:
            continue
        sizes, dims = saved(mean, "_saved_self_sym_sizes"), saved_dims(mean)
        if sizes is None or dims is None:
            continue
        sizes = tuple(int(s) for s in sizes)
        dims = dims if isinstance(dims, tuple) else (dims,)
        if len(sizes) < 3 or len(dims) != 1:
            continue
        axis = dims[0] % len(sizes)
        below = None  # the mean's subgraph, walked once for every token batch it may hold
        for shape, (tokens, fill) in shapes.items():
            rows, length = shape
            if rows == length or sizes[axis] != length:
                continue
            if axis == 1 and sizes[0] == rows:
                layout = "batch-first"
            elif axis == 0 and sizes[1] == rows:
                layout = "length-first"
            else:
                continue
            if below is None:
                below = post_order(mean, _NODES) or []
            found = _lookup_path(below, mean, tokens)
            if found is None:
                continue
            path, lookup = found
            if _mask_between(path, shape):
                continue
            pad = saved(lookup, "_saved_padding_idx")
            zero_rows = isinstance(pad, int) and signed(pad) == int(fill)  # -1: no padding_idx
            if zero_rows and all(type(n).__name__ in _ZERO_KEEPING for n in path):
                continue  # zeros averaged in: a scale by the length only
            with torch.no_grad():
                padded = round(float((tokens == fill).float().mean()), 4)
            yield shape, fill, padded, layout


def _lookup_path(order: list, mean, tokens: torch.Tensor):
    """``(the nodes between the mean and the lookup, the lookup)`` for the embedding lookup of
    ``tokens`` in ``order`` (the mean's subgraph, inputs first); None when there is none."""
    above: set = set()  # nodes with the lookup below them
    lookup = None
    for node in order:  # inputs first
        if type(node).__name__ == "EmbeddingBackward0" and lookup is None:
            ids = saved(node, "_saved_indices")
            if isinstance(ids, torch.Tensor) and ids.shape == tokens.shape \
                    and ids.device.type == "cpu" and bool(torch.equal(ids, tokens)):
                lookup = node
                continue
        if lookup is not None and any(child is lookup or child in above
                                      for child, _ in node.next_functions if child is not None):
            above.add(node)
    if lookup is None:
        return None
    return [n for n in order if n in above and n is not mean], lookup
