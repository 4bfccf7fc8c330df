"""A softmax or log-softmax on the loss's path taken over dim 0 of a per-sample tensor: each
sample's probabilities are normalised over the other samples of the batch.

``torch.softmax(logits, dim=0)`` on (batch, classes[, H, W]) logits makes every class column sum
to 1 over the batch: a sample's probabilities depend on what the other samples predict, and a
loss that reads them row by row (a Dice, a focal term, a hand-written cross-entropy, a
distillation between softened outputs) trains on numbers that are no distribution over the
classes. The shapes agree, nothing fails.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for ``SoftmaxBackward0`` / ``LogSoftmaxBackward0`` nodes
with ``dim`` 0 (or ``-ndim``). One is kept when its result is laid out like a batch of samples:
two dimensions or more, another one longer than 1 (a class axis: a (K, 1) softmax over a bag's
instances is the only axis there is), not square in its first two (a (B, B) similarity matrix
is normalised over either axis on purpose, CLIP's), and its dim 0 as long as the leading
dimension of a tensor without gradient that the graph below it read (the batch of data, a
target): the samples. When the DataLoader's latest batch size is known and differs, nothing
is kept (a bag of instances served one at a time). Each kept node becomes one ``softmax_batch``
aside event (the function, the result's shape, the batch size) at the backward's line; the rule
finds the call in the script's source. Only shapes are read: no saved tensor's values, and
nothing under saved-tensor hooks (``graphpaths.saved``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_BELOW = 4000  # nodes walked below a softmax to find the batch it reads
_TARGET_READS = 8  # soft targets read (a sum over the classes each), first backwards only
_KINDS = {"SoftmaxBackward0": "softmax", "LogSoftmaxBackward0": "log_softmax"}


def _shape(tensor) -> tuple | None:
    return tuple(int(s) for s in tensor.shape) if isinstance(tensor, torch.Tensor) else None


def _data_leading(root, limit: int) -> set[int]:
    """The leading sizes of the tensors without gradient (data, targets, masks) that the nodes
    below ``root`` saved."""
    nodes = post_order(root, limit)
    sizes: set[int] = set()
    for node in nodes or ():
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = saved(node, name)
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and not value.requires_grad \
                    and value.grad_fn is None:
                sizes.add(int(value.shape[0]))
    return sizes


def _target_leading(nodes) -> set[int]:
    """The leading sizes of the targets the loss nodes among ``nodes`` saved (a cross-entropy's
    class indices, a regression's values), and of the class indices a hand-written
    cross-entropy gathers along its last axis (``probs.gather(1, y[:, None])``): the loss's own
    batch."""
    sizes: set[int] = set()
    for node in nodes or ():
        value = saved(node, "_saved_target") if "_saved_target" in dir(node) else None
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            sizes.add(int(value.shape[0]))
        elif type(node).__name__ == "GatherBackward0":
            index, along = saved(node, "_saved_index"), saved_dims(node)
            if isinstance(index, torch.Tensor) and index.dim() >= 2 and isinstance(along, int) \
                    and along in (index.dim() - 1, -1) and not index.is_floating_point():
                sizes.add(int(index.shape[0]))
    return sizes


def over_batch(shape: tuple, dim: int, data_sizes: set[int], loader_batch: int | None,
               target_sizes: set[int] = frozenset()) -> bool:
    """Whether a softmax over ``dim`` of a result of ``shape`` normalises over the samples. Not
    when the loss's targets say the batch is axis 1 (``target_sizes`` holds ``shape[1]`` and
    not ``shape[0]``): a sequence-first (T, B, ...) tensor, whose dim 0 is time (attention
    pooling over an ``nn.LSTM``'s steps without ``batch_first``)."""
    if len(shape) < 2 or dim not in (0, -len(shape)):
        return False
    batch = shape[0]
    if batch < 2 or not any(s > 1 for s in shape[1:]) or shape[1] == batch:
        return False
    if loader_batch is not None and loader_batch != batch:
        return False
    if target_sizes and batch not in target_sizes and shape[1] in target_sizes:
        return False
    return batch in data_sizes


class SoftmaxBatchWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._targets = 0  # soft targets whose values were read
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("softmax over the batch", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loader_batch = None
        if self.loader is not None:
            try:
                loader_batch = self.loader.batch_size()
            except Exception:
                loader_batch = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            for node in nodes or ():
                if type(node).__name__ == "MulBackward0":
                    self._soft_target(node)
                    continue
                fn = _KINDS.get(type(node).__name__)
                if fn is None:
                    continue
                dim = saved_dims(node)  # signed: dim=-1 is saved as 2**64 - 1
                shape = _shape(saved(node, "_saved_result"))
                if not isinstance(dim, int) or shape is None:
                    continue
                key = (fn, shape, dim)
                if key in self._told or len(shape) < 2 or dim not in (0, -len(shape)):
                    continue
                if not over_batch(shape, dim, _data_leading(node, _BELOW), loader_batch,
                                  _target_leading(nodes)):
                    continue
                self._told.add(key)
                self.rec.emit_aside(ev.softmax_batch(fn=fn, shape=list(shape), batch=shape[0]),
                                    self.rec.here())

    def _soft_target(self, node) -> None:
        """A soft target (a teacher's probabilities, made without gradient) multiplied with a
        ``log_softmax`` over the classes (DINO's ``-q * log_softmax(s, dim=-1)``, a
        cross-entropy or ``kl_div`` with probability targets) whose rows do not sum to 1 over
        those classes while its columns' values are probabilities: normalised over another
        axis, the batch (``softmax(t, dim=0)``). One ``softmax_batch`` aside with ``target``."""
        if self._targets >= _TARGET_READS:
            return
        children = list(node.next_functions)
        if len(children) != 2:
            return
        sides = [type(child).__name__ if child is not None else None for child, _ in children]
        if sides.count("LogSoftmaxBackward0") != 1 or None not in sides:
            return
        log_softmax = children[sides.index("LogSoftmaxBackward0")][0]
        target = saved(node, "_saved_other" if sides[0] == "LogSoftmaxBackward0" else "_saved_self")
        result = saved(log_softmax, "_saved_result")
        dim = saved_dims(log_softmax)
        if not (isinstance(target, torch.Tensor) and isinstance(result, torch.Tensor)
                and isinstance(dim, int) and target.shape == result.shape and target.dim() >= 2
                and target.device.type == "cpu" and target.is_floating_point()):
            return
        shape = _shape(target)
        axis = dim % len(shape)
        if axis == 0 or shape[0] < 2 or shape[axis] < 2 or shape[0] == shape[axis]:
            return
        self._targets += 1
        with torch.no_grad():
            q = target.detach().float()
            if bool((q < 0).any()):
                q = -q  # -q * log_softmax(s): the target negated
            if bool((q < 0).any()) or bool((q > 1).any()):
                return
            binary = bool(((q == 0) | (q == 1)).all())  # multi-hot rows: target-outside-loss-domain's
            rows = q.sum(dim=axis)
            off = float(((rows - 1).abs() > 0.05).float().mean())
        if binary or off < 0.5:
            return
        key = ("target", shape, dim)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.softmax_batch(fn="softmax", shape=list(shape), batch=shape[0],
                                             target=True), self.rec.here())
