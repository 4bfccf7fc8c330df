"""Attention weights normalised over another axis than the one the next matmul sums over.

``weights = torch.softmax(scores, dim=1)`` on scores of shape (batch, queries, keys), then
``weights @ values``: the matmul sums each row of ``weights`` over the keys (its last dimension),
but the softmax made the columns sum to 1 (over the queries). Each output is a mix of the values
with weights that do not sum to 1 and that depend on the other queries' scores; the model still
trains and the loss still falls, to a worse model. The same with a 2-D (N, K) softmax over dim 0
(normalised across the batch) multiplied by a (K, D) matrix.

How it is seen: at the first ``_WINDOWS`` backwards, the loss's graph is walked once. At each
matrix product (``BmmBackward0``, ``MmBackward0``) the left operand's path is followed down
through the operations that keep its values in place (a view or reshape that keeps the last
dimension, expand, a transpose or permute of other axes, unsqueeze, dropout's mask product,
clone) to a ``SoftmaxBackward0`` whose saved result has the shape reached. A transpose that
moves the summed axis ends the walk: weights turned before the product were turned on purpose
(DiffPool's ``s.transpose(1, 2) @ x`` sums the nodes with each node's assignment normalised over
the clusters; attention pooling's ``softmax(s, dim=1).transpose(1, 2) @ h``). The dimension the product sums
over (the operand's last) is mapped back through each of those operations; when the softmax
normalised another one, a ``softmax_axis`` aside event names the backward and both dimensions.
Anything else on the way (a division that renormalises, as slot attention does; a gate of
another shape; a sum) ends the walk without a word. No per-call cost: only the graph of
the first backwards is read, then the watcher closes.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import packed, post_order, reached
from .recorder import Recorder

_WINDOWS = 3  # backwards whose loss graphs are walked
_NODES = 20000  # nodes walked per backward (a larger graph is not looked at)
_DOWN = 12  # operations followed from a product down to a softmax
_LEAVES = 20000  # nodes walked below a softmax to name the parameters of its scores

# operations whose output keeps the input's shape and values in place, element for element
_SAME = ("CloneBackward", "NativeDropoutBackward", "MulBackward", "ToCopyBackward",
         "AliasBackward", "MaskedFillBackward")
_VIEW = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")


def _signed(value: int) -> int:
    """A dimension saved as an unsigned 64-bit number (-1 reads as 2**64 - 1)."""
    value = int(value)
    return value - 2 ** 64 if value >= 2 ** 63 else value


def _saved(node, name: str):
    """What ``node`` saved as ``name``, or None: released, not saved, or saved under
    saved-tensor hooks (non-reentrant checkpointing, offloading), whose unpacking would run the
    checkpointed forward again (BatchNorm's running statistics updated twice)."""
    if packed(node, name):
        return None
    try:
        return getattr(node, name)
    except Exception:  # released, or not saved for this configuration
        return None


def _softmax_below(node, shape: tuple, dim: int):
    """Follow ``node`` (the producer of a product's left operand of ``shape``, summed over
    ``dim``) down to a softmax: ``(softmax node, its normalised dim, the dim summed over, its
    shape)`` or None when the path leaves the value-keeping operations first."""
    for _ in range(_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        n = len(shape)
        if name.startswith("SoftmaxBackward"):
            result = _saved(node, "_saved_result")
            saved_dim = _saved(node, "_saved_dim")
            if result is None or saved_dim is None or tuple(result.shape) != shape:
                return None
            return node, _signed(saved_dim) % n, dim, shape
        if name.startswith(_SAME):
            if name.startswith("MulBackward"):
                # dropout's mask, or a scale: of the same shape, or a number (a gate broadcast
                # along a dimension weighs the rows or columns anew)
                other = _saved(node, "_saved_other")
                if isinstance(other, torch.Tensor) and other.dim() and tuple(other.shape) != shape:
                    return None
            children = [child for child, _ in node.next_functions if child is not None]
            if len(children) != 1:
                return None
            node = children[0]
            continue
        if name.startswith(_VIEW):
            sizes = _saved(node, "_saved_self_sym_sizes")
            if sizes is None:
                return None
            sizes = tuple(int(s) for s in sizes)
            if dim != n - 1 or not sizes or sizes[-1] != shape[-1]:
                return None  # only the last dimension is followed through a reshape
            shape, dim = sizes, len(sizes) - 1
        elif name.startswith("ExpandBackward"):
            sizes = _saved(node, "_saved_self_sym_sizes")
            if sizes is None:
                return None
            sizes = tuple(int(s) for s in sizes)
            dim -= n - len(sizes)
            if dim < 0 or sizes[dim] != shape[dim + n - len(sizes)]:
                return None  # the summed dimension was broadcast: nothing normalised along it
            shape = sizes
        elif name.startswith("TransposeBackward"):
            d0, d1 = (_saved(node, "_saved_dim0"), _saved(node, "_saved_dim1"))
            if d0 is None or d1 is None:
                return None
            d0, d1 = _signed(d0) % n, _signed(d1) % n
            if dim in (d0, d1):
                return None  # the weights turned on purpose (DiffPool's S.transpose(1, 2) @ x)
            swapped = list(shape)
            swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
            shape = tuple(swapped)
        elif name.startswith("PermuteBackward"):
            dims = _saved(node, "_saved_dims")
            if dims is None or len(dims) != n:
                return None
            dims = [_signed(d) % n for d in dims]
            if dims[dim] != dim:
                return None  # the summed axis moved: turned on purpose, as above
            inverse = [0] * n
            for i, d in enumerate(dims):
                inverse[d] = i
            shape = tuple(shape[inverse[i]] for i in range(n))
        elif name.startswith("UnsqueezeBackward"):
            at = _saved(node, "_saved_dim")
            if at is None:
                return None
            at = _signed(at) % n
            if dim == at:
                return None
            dim -= dim > at
            shape = shape[:at] + shape[at + 1:]
        else:
            return None
        children = [child for child, _ in node.next_functions if child is not None]
        if len(children) != 1:
            return None
        node = children[0]
    return None


class SoftmaxAxisWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._windows = 0
        self._told: set = set()  # (softmax dim, summed dim, shape) already reported

    def install(self, patcher) -> None:  # subscribes to DESCRIBE_LOSS only (instrument/__init__.py)
        pass

    def describe_loss(self, tensors) -> dict:
        if self._windows >= _WINDOWS:
            return {}
        self._windows += 1
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("softmax axis", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if nodes is None:
                continue
            for node in nodes:
                name = type(node).__name__
                if not name.startswith(("BmmBackward", "MmBackward")):
                    continue
                left = _saved(node, "_saved_self")
                if not isinstance(left, torch.Tensor) or left.dim() < 2:
                    continue
                shape = tuple(left.shape)
                if shape[-1] < 2:
                    continue
                found = _softmax_below(node.next_functions[0][0], shape, len(shape) - 1)
                if found is None:
                    continue
                softmax, normalised, summed, sm_shape = found
                if normalised == summed or sm_shape[normalised] < 2:
                    continue
                key = (normalised, summed, sm_shape)
                if key in self._told:
                    continue
                self._told.add(key)
                self._report(softmax, normalised, summed, sm_shape)

    def _report(self, softmax, normalised: int, summed: int, shape: tuple) -> None:
        rec = self.rec
        tensors = rec.tensors
        walked = reached(softmax, _LEAVES, truncate=True)
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        rec.emit_aside(ev.softmax_axis(dim=normalised, summed=summed, shape=list(shape),
                                       params=pids[:64]),
                       rec.here())
