"""A global pooling of a convolution's output taken over its channel axis, fed to a Linear layer
(pooled-over-channels).

A convolution's output is channels-first: (N, C, L) for ``Conv1d``, (N, C, H, W) for ``Conv2d``.
PointNet's symmetric function is a max over the points, ``torch.max(x, 2)[0]`` of (B, 1024, N),
a text CNN's max-over-time pooling is over dim 2, a global average pool over dims (2, 3). Written
over dim 1 instead (``torch.max(x, 1)[0]``, ``x.mean(1)``), it pools the channels: each sample
keeps one number per point (or time step, or pixel), which the classifier's ``Linear`` then
reads as features. When the two sizes agree (1024 points and 1024 channels, or a Linear sized
for whatever came out), nothing fails: the model is no longer invariant to the points' order,
the learned channels are thrown away but their maximum, and training goes on.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for the matrix products of linear layers
(``AddmmBackward0``, ``MmBackward0``); from each one's input, through value-keeping and
elementwise nodes (views, flatten, activations, dropout), to a reduction (``MaxBackward0``,
``AmaxBackward0``, ``MeanBackward1``, ``SumBackward1``, ``LogsumexpBackward0``) whose
dimensions are exactly dim 1 of an input of three axes or more, and from that reduction's
input through elementwise nodes and normalisations (activations, BatchNorm, dropout) to a
``ConvolutionBackward0``: a channels-first feature map. One ``channel_pool`` aside event per
reduction kind and shape (loc: the backward's line; the rule finds the pooling call in the
source). Only node types and saved sizes are read (``graphpaths.saved``), no tensor value.

Silent: a pooling over the points, time or pixels (dim 2, dims (2, 3), dim -1); a pooling over
dim 1 of a tensor no convolution made straight (a Transformer's (N, T, D) tokens averaged over
T; a convolution's output transposed first, ``x.transpose(1, 2).max(1)``); a channel pooling
whose result goes to a convolution (CBAM's spatial attention, ``torch.cat([x.mean(1,
keepdim=True), x.amax(1, keepdim=True)], 1)``), not to a Linear.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 8  # nodes followed from a linear layer's input to a reduction, and from it to a conv
_LINEAR = ("AddmmBackward0", "MmBackward0")
_REDUCTIONS = {"MaxBackward0": "max", "AmaxBackward0": "amax", "MeanBackward1": "mean",
               "SumBackward1": "sum", "LogsumexpBackward0": "logsumexp"}
# between the linear layer and the pooling: shapes only, or values one by one
_TO_POOL = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Flatten", "Clone",
            "Relu", "LeakyRelu", "Gelu", "Silu", "Elu", "Hardtanh", "Tanh", "Sigmoid",
            "NativeDropout", "Mul", "Div", "NativeBatchNorm", "CudnnBatchNorm", "ToCopy")
# between the pooling and the convolution: values one by one (no axis moved)
_TO_CONV = ("Relu", "LeakyRelu", "Gelu", "Silu", "Elu", "Hardtanh", "Tanh", "Sigmoid",
            "NativeDropout", "Mul", "NativeBatchNorm", "CudnnBatchNorm", "Clone", "ToCopy",
            "Mish", "Hardswish", "Softplus", "Add")


def _input_shape(node) -> tuple[int, ...] | None:
    sizes = saved(node, "_saved_self_sym_sizes")
    if isinstance(sizes, (tuple, list, torch.Size)):
        try:
            return tuple(int(s) for s in sizes)
        except (TypeError, ValueError):
            return None
    tensor = saved(node, "_saved_self")
    return tuple(int(s) for s in tensor.shape) if isinstance(tensor, torch.Tensor) else None


def _parents(node) -> list:
    return [n for n, _ in getattr(node, "next_functions", ()) if n is not None
            and type(n).__name__ not in ("AccumulateGrad", "TBackward0")]


def _reaches(node, names: tuple, found, depth: int = _DEPTH):
    """The first node below ``node`` for which ``found`` is true, through nodes whose names
    start with ``names`` only (a walk of at most ``depth`` steps down each path), or None."""
    todo = [(node, depth)]
    seen: set = set()
    while todo:
        current, left = todo.pop()
        if current is None or id(current) in seen or left < 0:
            continue
        seen.add(id(current))
        if found(current):
            return current
        if not type(current).__name__.startswith(names):
            continue
        todo += [(p, left - 1) for p in _parents(current)]
    return None


def channel_pooling(node) -> tuple[str, tuple, tuple] | None:
    """``(op, input shape, axes)`` when ``node`` is a reduction over exactly dim 1 of a
    channels-first convolution output, else None."""
    op = _REDUCTIONS.get(type(node).__name__)
    if op is None:
        return None
    dims = saved_dims(node)
    dims = (dims,) if isinstance(dims, int) else dims
    shape = _input_shape(node)
    if not dims or shape is None or len(shape) < 3 or shape[1] < 2:
        return None
    axes = tuple(sorted({d % len(shape) for d in dims}))
    if axes != (1,):
        return None
    if not any(_reaches(p, _TO_CONV, lambda n: type(n).__name__ == "ConvolutionBackward0")
               is not None for p in _parents(node)):
        return None  # no convolution's channels-first output straight below
    return op, shape, axes


class ChannelPoolWatcher:
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
            self.rec.internal_error("pooling over channels", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ not in _LINEAR:
                    continue
                for parent in _parents(node):
                    pool = _reaches(parent, _TO_POOL, lambda n: channel_pooling(n) is not None)
                    if pool is None:
                        continue
                    op, shape, axes = channel_pooling(pool)
                    key = (op, shape)
                    if key in self._told:
                        continue
                    self._told.add(key)
                    if loc is None:
                        loc = self.rec.here()
                    self.rec.emit_aside(ev.channel_pool(op=op, shape=list(shape),
                                                        dims=list(axes)), loc)
