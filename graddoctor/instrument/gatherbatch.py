"""A per-sample pick (``gather``) on the loss's path taken along dim 0, the batch, with an index
of class or action numbers: each sample's value is read from another sample's row.

DQN's ``q = policy_net(states).gather(0, actions)`` on (batch, actions) Q-values with (batch, 1)
action indices reads ``Q[actions[i], 0]``: the first action's value of the sample whose number
is the action taken, not the value of the action sample ``i`` took. A hand-written negative
log-likelihood ``log_probs.gather(0, labels.unsqueeze(1))``, a policy gradient's
``log_pi.gather(0, actions)``: the same slip. The index is in range (its numbers are below the
number of classes, which is below the batch size), so nothing fails, every shape agrees, and
the loss trains a few rows' first column toward the targets of every sample.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for ``GatherBackward0`` nodes (``gather``,
``take_along_dim``) whose dim is 0 of an input of two dimensions or more. One is kept when:
its input is laid out like a batch of samples (``softmaxbatch.over_batch``: another axis longer
than 1, not square in its first two, dim 0 as long as a tensor without gradient read below it,
the DataLoader's latest batch when there is one); its index has one row per sample (as long as
the input along dim 0) and is narrower than the input along dim 1 (a pick, not rows reordered
whole: ``x.gather(0, perm[:, None].expand(-1, K))``); and its largest value is below the length
of dim 1, which is below the batch: numbers of the other axis (classes, actions), which never
reach the batch's later rows. Each kept node becomes one ``gather_batch`` aside event at the
backward's line; the rule finds the call in the script's source. The index is read once per
candidate (one small reduction; on an accelerator one host sync per candidate of the first
backwards); nothing under saved-tensor hooks is unpacked (``graphpaths.saved``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder
from .softmaxbatch import _BELOW, _data_leading, over_batch

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward


def picks_along_batch(shape: tuple, index_shape: tuple, largest: int, data_sizes: set[int],
                      loader_batch: int | None) -> bool:
    """Whether a gather along dim 0 of an input of ``shape`` with an index of ``index_shape``
    whose largest value is ``largest`` picks, for each sample, a class or action number along
    the batch axis."""
    if len(shape) < 2 or len(index_shape) != len(shape):
        return False
    batch, width = shape[0], shape[1]
    if index_shape[0] != batch or index_shape[1] >= width:
        return False  # not one row of picks per sample, or whole rows moved
    if not 0 <= largest < width < batch:
        return False  # the index can be a row number: it reaches past the other axis
    return over_batch(shape, 0, data_sizes, loader_batch)


class GatherBatchWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("gather along the batch", exc)
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
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ == "IndexBackward0":
                    self._crossed(node, loader_batch)
                    continue
                if type(node).__name__ != "GatherBackward0":
                    continue
                dim = saved_dims(node)
                source, index = saved(node, "_saved_self"), saved(node, "_saved_index")
                if not isinstance(dim, int) or not isinstance(source, torch.Tensor) \
                        or not isinstance(index, torch.Tensor) or source.dim() < 2:
                    continue
                shape = tuple(int(s) for s in source.shape)
                index_shape = tuple(int(s) for s in index.shape)
                if dim % len(shape) != 0:
                    continue
                key = (shape, index_shape)
                if key in self._told or index.numel() == 0 or len(index_shape) != len(shape) \
                        or index_shape[0] != shape[0] or index_shape[1] >= shape[1]:
                    continue
                self._told.add(key)  # looked at once, whatever the answer
                largest = int(index.detach().max())
                if not picks_along_batch(shape, index_shape, largest, _data_leading(node, _BELOW),
                                         loader_batch):
                    continue
                self.rec.emit_aside(ev.gather_batch(shape=list(shape), index=list(index_shape),
                                                    largest=largest, batch=shape[0]),
                                    self.rec.here())

    def _crossed(self, node, loader_batch) -> None:
        """``p[:, y]`` on (B, C) per-sample scores with one class number per sample: each row
        reads the class of every sample, a (B, B) matrix, where ``p[arange(B), y]`` (one pick per
        row) was meant. Kept when the index is the only one, on dim 1, integer, as long as the
        batch and below C; the input is laid out like a batch (``over_batch``), not square; and
        the numbers repeat or C is below the batch (class numbers, not a sampled subset of
        columns)."""
        indices = saved(node, "_saved_indices")
        sizes = saved(node, "_saved_self_sym_sizes")
        if not isinstance(indices, (tuple, list)) or len(indices) != 2 or indices[0] is not None \
                or not isinstance(sizes, (tuple, list)) or len(sizes) != 2:
            return
        index = indices[1]
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.is_floating_point() \
                or index.dtype == torch.bool or index.device.type != "cpu":
            return
        shape = tuple(int(s) for s in sizes)
        batch, width = shape
        key = ("crossed", shape, int(index.numel()))
        if key in self._told or index.numel() != batch or batch == width or width < 2 or batch < 4:
            return
        self._told.add(key)
        with torch.no_grad():
            largest, smallest = int(index.max()), int(index.min())
            distinct = int(torch.unique(index).numel())
        if smallest < 0 or largest >= width or (distinct == batch and width >= batch):
            return
        if not over_batch(shape, 0, _data_leading(node, _BELOW), loader_batch):
            return
        self.rec.emit_aside(ev.gather_batch(shape=list(shape), index=[batch], largest=largest,
                                            batch=batch, crossed=True), self.rec.here())
