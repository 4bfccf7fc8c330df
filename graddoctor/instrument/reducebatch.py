"""A reduction that is not a sum or a mean (logsumexp, max, min, prod) taken over dim 0 of a
per-sample tensor on the loss's path: each sample's score is combined with the other samples'.

A mixture density network's ``torch.logsumexp(log_pi + log_prob, dim=0)`` on (batch, components)
log-likelihoods sums each component over the batch instead of each sample over its components;
``scores.max(dim=0)`` of a multi-class hinge, ``q.min(dim=0)`` of an ensemble of critics, a
``prod(dim=0)`` of per-frame probabilities: each is meant over the sample's own axis. The loss
still falls and every shape agrees, because the loss's final mean takes whatever axis is left.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), and at those of a later
training phase (``LossWindow``: an optimizer given parameters after they ran), the loss's graph is
walked once (at most ``_NODES`` nodes) for ``LogsumexpBackward0``, ``MaxBackward0``,
``MinBackward0``, ``AmaxBackward0``, ``AminBackward0`` and ``ProdBackward1`` nodes whose
dimensions include dim 0 of their input. One is a candidate when its input is laid out like a
batch of samples (``softmaxbatch.over_batch``: another axis longer than 1, not square in its
first two, dim 0 as long as the leading dimension of a tensor without gradient read below it,
the DataLoader's latest batch when there is one), when an axis longer than 1 is left after the
reduction (a reduction over every axis is one number for the batch: a global max, a
log-sum-exp over all pairs) and no axis left is as long as the leading dimension of a tensor
without gradient anywhere in the loss's graph (either could be the batch: the columns of a
(samples, candidates) similarity matrix, captions against images, each column normalised
over the rows on purpose; a time-major (T, B, H) output max-pooled over time, its B as long
as the labels), and when its input is not straight a (log-)softmax's result over
another axis (the log of the batch's marginal distribution, an entropy of cluster assignments).

A reduction that leaves dim 0 is a candidate in a samples-first layout (``batch_axis_inside``):
the one axis other than 0 as long as the DataLoader's latest batch (dim 0 not that long) among
its dimensions, a tensor of data with that leading size read below it, an axis longer than 1
left, and no axis left as long as the leading size of another tensor of the data unless that
tensor is itself laid out samples-first (a draw of [K, B, ...]): IWAE's ``logsumexp(log_w,
dim=1)`` on [K, B] (``batch_dim`` in the event).

A candidate is reported only if the loss depends on it: its node gets a hook
(``Node.register_prehook``, which reads the gradient arriving at the reduction's result and
returns None) and a ``reduce_batch`` aside event is emitted when that gradient is not zero
(beyond ``_CANCELLED``). A batch max subtracted for stability and added back gets a gradient
that cancels to rounding error. The hooks are removed at the next look and at the run's end.
Only shapes and the incoming gradient are read (on an accelerator, one host sync per candidate
of the first backwards): no saved tensor's values, and nothing under saved-tensor hooks
(``graphpaths.saved``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .patcher import check_hook
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder
from .softmaxbatch import over_batch

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_BELOW = 4000  # nodes walked below a reduction to find the batch it reads
_CANCELLED = 1e-6  # largest incoming gradient of a reduction the loss does not depend on
_KINDS = {"LogsumexpBackward0": "logsumexp", "MaxBackward0": "max", "MinBackward0": "min",
          "AmaxBackward0": "amax", "AminBackward0": "amin", "ProdBackward1": "prod"}
# a reduction over the batch of a distribution normalised over its other axis is the batch's
# marginal (an entropy of the cluster assignments), taken on purpose
_DISTRIBUTIONS = frozenset({"LogSoftmaxBackward0", "SoftmaxBackward0"})


# the nodes whose saved indices are their own output (a max's argmax), not an input (an
# embedding's token ids)
_INDEXING = ("Max", "Min", "Sort", "Topk", "Kthvalue", "Median", "Nanmedian", "Mode", "Cummax",
             "Cummin", "Adaptive", "Fractional")


def _data_leading(root, limit: int) -> set[int]:
    """The leading sizes of the tensors without gradient (data, targets, masks) that the nodes
    below ``root`` saved as inputs."""
    sizes: set[int] = set()
    for node in post_order(root, limit) or ():
        outputs = ("_saved_result", "_saved_indices") if type(node).__name__.startswith(_INDEXING) \
            else ("_saved_result",)
        for name in dir(node):
            if not name.startswith("_saved_") or name.startswith(outputs):
                continue
            value = saved(node, name)
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and not value.requires_grad \
                    and value.grad_fn is None:
                sizes.add(int(value.shape[0]))
    return sizes


def _data_shapes(root, limit: int) -> set[tuple]:
    """The shapes of the tensors without gradient (data, targets, draws) that the nodes below
    ``root`` saved as inputs."""
    shapes: set[tuple] = set()
    for node in post_order(root, limit) or ():
        outputs = ("_saved_result", "_saved_indices") if type(node).__name__.startswith(_INDEXING) \
            else ("_saved_result",)
        for name in dir(node):
            if not name.startswith("_saved_") or name.startswith(outputs):
                continue
            value = saved(node, name)
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and not value.requires_grad \
                    and value.grad_fn is None:
                shapes.add(tuple(int(s) for s in value.shape))
    return shapes


def batch_axis_inside(shape: tuple, axes: list[int], data_shapes: set[tuple],
                      loader_batch: int | None) -> int | None:
    """The batch axis of a samples-first layout (``[K, B]`` importance weights, ``[S, B, C]``
    Monte-Carlo draws) that a reduction over ``axes`` takes: the one axis other than 0 as long
    as the DataLoader's latest batch, dim 0 not that long, the batch read below as the leading
    dimension of a tensor of data, and each axis left that is longer than 1 no length of
    another tensor of the data (captions against images: each caption's reduction over the
    images) unless that tensor is laid out samples-first too (a draw of ``[K, B, ...]``).
    None otherwise (and for a batch at dim 0: ``reduced_over_batch``'s)."""
    if loader_batch is None or loader_batch < 2 or len(shape) < 2 or shape[0] == loader_batch:
        return None
    at = [i for i in range(1, len(shape)) if shape[i] == loader_batch]
    if len(at) != 1 or at[0] not in axes:
        return None
    batch = at[0]
    if not any(s and s[0] == loader_batch for s in data_shapes):
        return None
    left = [shape[i] for i in range(len(shape)) if i not in axes]
    if not any(size > 1 for size in left):
        return None
    for size in left:
        if size > 1 and any(s[0] == size and (len(s) < 2 or s[1] != loader_batch)
                            for s in data_shapes):
            return None
    return batch


def _dims(node) -> tuple[int, ...] | None:
    dim = saved_dims(node)
    return (dim,) if isinstance(dim, int) else dim


def _input_shape(node) -> tuple[int, ...] | None:
    sizes = saved(node, "_saved_self_sym_sizes")
    if isinstance(sizes, (tuple, list, torch.Size)):
        try:
            return tuple(int(s) for s in sizes)
        except (TypeError, ValueError):
            return None
    tensor = saved(node, "_saved_self")
    return tuple(int(s) for s in tensor.shape) if isinstance(tensor, torch.Tensor) else None


def reduced_over_batch(shape: tuple, dims: tuple, data_sizes: set[int],
                       loader_batch: int | None) -> bool:
    """Whether a reduction over ``dims`` of an input of ``shape`` combines the samples of a
    batch while leaving each of them an axis of its own that it was meant to reduce."""
    ndim = len(shape)
    if ndim < 2:
        return False
    axes = {d % ndim for d in dims}
    if 0 not in axes:
        return False
    left = [shape[i] for i in range(1, ndim) if i not in axes]
    if not any(s > 1 for s in left):
        return False  # one number for the whole batch
    if any(s > 1 and s in data_sizes for s in left):
        return False  # the columns are candidates from the data: normalised over the rows
    return over_batch(shape, 0, data_sizes, loader_batch)


def _is_distribution(node, ndim: int) -> bool:
    """Whether ``node`` reduces straight the result of a (log-)softmax over another axis than
    dim 0."""
    for child, _ in node.next_functions:
        if child is not None and type(child).__name__ in _DISTRIBUTIONS:
            dim = saved_dims(child)
            return isinstance(dim, int) and dim % ndim != 0
    return False


class ReduceBatchWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        # a later phase's first backwards are read too: the look is graph-only (node prehooks
        # taken out at the next look), nothing of torch is wrapped again
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._told: set = set()
        self._handles: list = []

    def install(self, patcher) -> None:
        patcher.handle(_Cleanup(self._remove))  # hooks of the last look go at the run's end

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        self._remove()
        try:
            self._look(tensors)
        except Exception as exc:
            self._remove()
            self.rec.internal_error("reduction over the batch", exc)
        return {}

    def _remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loader_batch = None
        if self.loader is not None:
            try:
                loader_batch = self.loader.batch_size()
            except Exception:
                loader_batch = None
        loc = self.rec.here()
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            everywhere: set[int] | None = None  # the leading sizes of the whole graph's data
            for node in post_order(root, _NODES) or ():
                fn = _KINDS.get(type(node).__name__)
                if fn is None:
                    continue
                dims, shape = _dims(node), _input_shape(node)
                if dims is None or shape is None:
                    continue
                if len(shape) < 2:
                    continue
                axes = sorted({d % len(shape) for d in dims})
                key = (fn, shape, tuple(axes))
                if key in self._told or _is_distribution(node, len(shape)):
                    continue
                if 0 not in axes:
                    batch = batch_axis_inside(shape, axes, _data_shapes(node, _BELOW), loader_batch)
                    if batch is not None:
                        made = ev.reduce_batch(fn=fn, shape=list(shape), dims=axes,
                                               batch=shape[batch], batch_dim=batch)
                        self._handles.append(check_hook(node.register_prehook(
                            self._depends(key, made, loc))))
                    continue
                if not reduced_over_batch(shape, dims, _data_leading(node, _BELOW), loader_batch):
                    continue
                if everywhere is None:
                    everywhere = _data_leading(root, _NODES)
                if any(shape[i] > 1 and shape[i] in everywhere for i in range(1, len(shape))
                       if i not in axes):
                    continue  # an axis left is as long as the data too: either could be the batch
                made = ev.reduce_batch(fn=fn, shape=list(shape), dims=axes, batch=shape[0])
                self._handles.append(check_hook(node.register_prehook(self._depends(key, made, loc))))

    def _depends(self, key, made, loc):
        """The hook that emits ``made`` when the gradient reaching the reduction is not zero
        (told once per key: a reduction whose gradient cancelled is looked at again)."""
        rec, told = self.rec, self._told

        def hook(grad_outputs):
            if key in told:
                return None
            try:
                grad = grad_outputs[0] if grad_outputs else None
                if isinstance(grad, torch.Tensor) and grad.layout == torch.strided and \
                        bool((grad.detach().abs() > _CANCELLED).any()):
                    told.add(key)
                    rec.emit_aside(made, loc)
            except Exception as exc:
                rec.internal_error("reduction over the batch (gradient)", exc)
            return None

        return hook


class _Cleanup:
    """A patcher entry that removes the hooks of the last look when the run ends."""

    # no hook of its own: nothing to take out while benchmarks/overhead.py suspends the patches
    follows_a_patch = True

    def __init__(self, remove) -> None:
        self.remove = remove
