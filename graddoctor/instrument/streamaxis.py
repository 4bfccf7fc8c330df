"""A language model's token batch cut from one stream along the wrong axis: its sequences
interleave the corpus instead of reading it in order.

``batchify`` in the word-language-model recipe lays a 1-D token stream out as ``bsz`` columns,
each a contiguous stretch of the corpus: ``data.view(bsz, -1).t().contiguous()``. Written
``data.view(-1, bsz)`` (no transpose), the result has the same shape, and ``get_batch`` still
slices ``seq_len`` rows with their targets one row later; but each column now holds every
``bsz``-th token of the corpus. The model is trained to predict the token ``bsz`` places ahead,
which the text does not determine: the loss stays near the unigram entropy and nothing fails.

What is read: at the first ``_WINDOWS`` backwards, the loss's graph (``_NODES`` nodes at most),
for the ``EmbeddingBackward0`` nodes whose saved ids are a 2-D integer CPU tensor that is a view
of a contiguous 1-D integer tensor (the stream: ``ids._base``, the batch sliced from it without
a copy) and the ``NllLossBackward0`` nodes' saved integer targets of as many elements. The time
axis is the one along which the targets are the ids one step later (at 90 % of the positions,
ignored targets left out). Each id's position in the stream follows from the view's offset and
strides; the axis is judged when its stride in the stream is not 1 while the other axis's is 1
(the sequences step through the stream ``stride`` tokens at a time) and, at 90 % of the
positions, the target is the stream's token ``stride`` places ahead and not the next one.
A ``stream_interleaved`` aside event is recorded once per (axis, stride).

Silent on batches copied out of the stream (``.t().contiguous()``, ``torch.stack`` of windows:
no view, nothing to read), windows that read the stream in order (``unfold``, a transposed
view), and targets that are the stream's next token. Cost: one graph walk at the first 3
backwards, a few comparisons per embedding found there; CPU only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose loss graphs are walked
_NODES = 20000  # nodes walked per backward
_MATCH = 0.9  # share of the positions a shift must match
_MIN_POSITIONS = 16


def _stream_of(ids):
    """The contiguous 1-D integer tensor ``ids`` is a view of, or None."""
    base = getattr(ids, "_base", None)
    if not isinstance(base, torch.Tensor) or base.dim() != 1 or base.is_floating_point() \
            or base.dtype == torch.bool or base.stride(0) != 1 or base.device.type != "cpu":
        return None
    return base


def _shifted_axis(ids, target, ignore: int) -> int | None:
    """The axis ``a`` of ``ids`` along which ``target`` (laid out like ``ids``) holds the ids one
    step later at 90 % of the positions not ignored, or None."""
    for axis in (0, 1):
        n = int(ids.shape[axis])
        if n < 2:
            continue
        t = target.narrow(axis, 0, n - 1)
        i = ids.narrow(axis, 1, n - 1)
        keep = t != ignore
        count = int(keep.sum())
        if count >= _MIN_POSITIONS and float(((t == i) & keep).sum()) / count >= _MATCH:
            return axis
    return None


def interleaved(ids, target, ignore: int = -100):
    """``(axis, stride)`` when ``ids`` (2-D, a view of a 1-D token stream) walks that stream
    ``stride`` tokens at a time along its time axis ``axis`` while its other axis is contiguous
    in it, and ``target`` (as many elements) holds the stream's token ``stride`` places ahead
    rather than the next one; else None."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.device.type != "cpu" \
            or ids.is_floating_point() or not isinstance(target, torch.Tensor) \
            or target.device.type != "cpu" or target.is_floating_point() \
            or target.numel() != ids.numel() or ids.numel() < _MIN_POSITIONS:
        return None
    stream = _stream_of(ids)
    if stream is None:
        return None
    with torch.no_grad():
        y = target.reshape(ids.shape)
        axis = _shifted_axis(ids, y, ignore)
        if axis is None:
            return None
        stride, other = int(ids.stride(axis)), int(ids.stride(1 - axis))
        if stride in (0, 1) or abs(other) != 1:
            return None
        # each id's place in the stream
        start = ids.storage_offset() - stream.storage_offset()
        rows = torch.arange(ids.shape[0]).unsqueeze(1) * ids.stride(0)
        cols = torch.arange(ids.shape[1]).unsqueeze(0) * ids.stride(1)
        where = start + rows + cols
        n = stream.numel()
        inside = (where >= 0) & (where + max(stride, 1) < n)
        if int(inside.sum()) < _MIN_POSITIONS:
            return None
        keep = inside & (y != ignore)
        count = int(keep.sum())
        if count < _MIN_POSITIONS:
            return None
        ahead = stream[(where + stride).clamp(0, n - 1)]
        following = stream[(where + 1).clamp(0, n - 1)]
        as_ahead = float(((y == ahead) & keep).sum()) / count
        as_next = float(((y == following) & keep).sum()) / count
        if as_ahead < _MATCH or as_next >= _MATCH:
            return None
    return axis, stride


class StreamAxisWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.loss_window = LossWindow(rec, _WINDOWS, self.describe_loss)
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribes to DESCRIBE_LOSS only (instrument/__init__.py)
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("token stream axis", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if nodes is None:
                continue
            ids_found, targets = [], []
            for node in nodes:
                name = type(node).__name__
                if name.startswith("EmbeddingBackward"):
                    ids = saved(node, "_saved_indices")
                    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and _stream_of(ids) is not None:
                        ids_found.append((ids, node))
                elif name.startswith(("NllLossBackward", "NllLoss2DBackward")):
                    target = saved(node, "_saved_target")
                    ignore = saved(node, "_saved_ignore_index", -100)
                    if isinstance(target, torch.Tensor):
                        targets.append((target, signed(ignore) if isinstance(ignore, int) else -100))
            if not ids_found or not targets:
                continue
            for ids, node in ids_found:
                for target, ignore in targets:
                    found = interleaved(ids, target, ignore)
                    if found is None:
                        continue
                    axis, stride = found
                    key = (axis, stride)
                    if key in self._told:
                        continue
                    self._told.add(key)
                    weight = node.next_functions[0][0] if node.next_functions else None
                    param = getattr(weight, "variable", None)
                    pid = self.rec.tensors.number.get(id(param)) if param is not None else None
                    self.rec.emit_aside(ev.stream_interleaved(
                        shape=[int(s) for s in ids.shape], axis=axis, stride=stride,
                        stream=int(_stream_of(ids).numel()), params=[pid] if pid is not None else []),
                        self.rec.here())
                    break
