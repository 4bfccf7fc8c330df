"""A full-batch loss over every row of a fixed label tensor: where evaluation rows can leak in.

A transductive script (a GCN over all nodes) or a full-batch tabular one computes the model's
output for all N rows and must index its training loss with the training rows
(``F.cross_entropy(out[train_mask], y[train_mask])``); written ``F.cross_entropy(out, y)`` it
trains on the labels of the rows it later evaluates on (``y[test_mask]``). This watcher records
the runtime half of that: a loss whose target is the same N-row tensor at every call of its line
(the same storage, offset, shape and strides, or on the CPU the same values in short: one fixed
label set cast anew each call, ``y.float()``, not a DataLoader's batch), whose
prediction has those N rows with no row selection in its graph (``IndexBackward0``,
``MaskedSelectBackward0``, ``IndexSelectBackward0`` within ``_NODES`` nodes), whose target
is not one of the data the prediction's first layers read (a reconstruction of the input is
not a label), and that reduces its rows itself (not ``reduction="none"`` nor weights of one
per row: a mask applied to the per-row losses afterwards selects the training rows). The rule (``rules/trains_on_evaluation_data.py``) reads the other half, the
script's selections of evaluation rows from that tensor, in its source.

Cost: at the first ``_CALLS`` calls per line (at most ``_LINES`` lines, ``_CALLS * _LINES``
calls in all) of the wrapped loss functions with a gradient (``losses.py``, ``loss_inputs.py`` tell ``loss_call``), a few
attribute reads and, at a line's second call with the same target, one walk of at most
``_NODES`` graph nodes; saved tensors are read through ``graphpaths.saved`` (never unpacked
under saved-tensor hooks). One ``full_rows_loss`` aside event per call line.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .recorder import Recorder
from .targetcolumn import _data_inputs

_CALLS = 3  # calls per loss line looked at
_LINES = 16  # loss lines looked at
_MIN_ROWS = 8  # rows a target has, at least
_NODES = 64  # nodes walked from the prediction for a row selection
_MAX_VALUES = 1 << 20  # values of a target fingerprinted, at most
_SELECTING = ("IndexBackward", "MaskedSelectBackward", "IndexSelectBackward")


def _storage_key(t) -> tuple | None:
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
                t.device.type)
    except Exception:  # a tensor without storage (a functional wrapper): not followed
        return None


def _fingerprint(t) -> tuple | None:
    """The rows' values in short (a CPU tensor of at most ``_MAX_VALUES`` values): the same
    labels cast or reshaped anew at each call (``y.float()``) give the same fingerprint."""
    if t.device.type != "cpu" or t.numel() > _MAX_VALUES or t.is_complex():
        return None
    with torch.no_grad():
        v = t.detach().reshape(t.shape[0], -1).to(torch.float64)
        weights = torch.arange(1, v.shape[0] + 1, dtype=torch.float64)
        return (v.shape, float(v.sum()), float((v.sum(1) * weights).sum()))


def _selects_rows(root) -> bool:
    """Whether a row selection (an index or a mask) is among the first ``_NODES`` nodes below
    ``root``."""
    seen, queue = set(), [root]
    while queue and len(seen) < _NODES:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith(_SELECTING):
            return True
        queue.extend(child for child, _ in node.next_functions)
    return False


def _masked_later(rest, kwargs: dict, rows: int) -> bool:
    """Whether the loss keeps one value per row (``reduction="none"``, ``reduce=False``: a mask
    may weigh them afterwards, as Kipf's masked cross-entropy does) or is given weights of one
    per row (``weight=train_mask.float()``)."""
    for value in (*rest, *kwargs.values()):
        if isinstance(value, str) and value == "none":
            return True
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
            return True
    return kwargs.get("reduce") is False


class FullRowsWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines: dict = {}  # call line -> [calls looked at, the first call's target key]
        self._told: set = set()
        self._calls = 0

    @property
    def open(self) -> bool:
        return self._calls < _CALLS * _LINES

    def loss_call(self, fn: str, input, target, args=(), kwargs=None) -> None:
        """A wrapped loss function called with a gradient: its prediction, target and
        arguments."""
        self._calls += 1
        try:
            if not (isinstance(target, torch.Tensor) and isinstance(input, torch.Tensor)
                    and input.grad_fn is not None and not target.requires_grad
                    and target.dim() >= 1 and input.dim() >= 1
                    and target.shape[0] >= _MIN_ROWS and input.shape[0] == target.shape[0]):
                return
            loc = self.rec.here()
            if loc is None or loc in self._told:
                return
            seen = self._lines.get(loc)
            if seen is None:
                if len(self._lines) >= _LINES:
                    return
                self._lines[loc] = [1, _storage_key(target), _fingerprint(target)]
                return
            if seen[0] >= _CALLS:
                return
            seen[0] += 1
            key = _storage_key(target)
            if key is None or (key != seen[1] and (seen[2] is None or _fingerprint(target) != seen[2])):
                return  # other labels each call: batches, not one fixed label set
            if _masked_later(args[2:], kwargs or {}, target.shape[0]) or _selects_rows(input.grad_fn):
                return
            ptr, values = key[0], None
            for x in _data_inputs(input.grad_fn):
                if x.untyped_storage().data_ptr() == ptr:
                    return  # the target is the model's input: a reconstruction, no labels
                if x.shape == target.shape:
                    values = _fingerprint(target) if values is None else values
                    if values is not None and _fingerprint(x) == values:
                        return  # a copy of the input
            self._told.add(loc)
            self.rec.emit_aside(ev.full_rows_loss(fn=fn, rows=int(target.shape[0])), loc)
        except Exception as exc:
            self.rec.internal_error(f"F.{fn} full-batch target", exc)
