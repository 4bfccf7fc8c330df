"""A loss target that is one of the model's own input columns: the label left in the table.

``X = data`` where ``data[:, -1]`` is the label, ``TensorDataset(table, table[:, 4])``: the
model is given the answer as a feature, learns to copy that column, and its training loss falls
to nearly 0 while it has learned nothing it can use where the target is not in the input.

At the first ``_CALLS`` calls of the wrapped loss functions with a gradient (``losses.py``,
``loss_inputs.py`` tell ``loss_call``), for a CPU target of one value per sample (N, or N x 1,
N >= ``_MIN_ROWS``, not constant): the prediction's graph is walked (``_NODES`` nodes) to the
first layers that read data without gradient (``AddmmBackward0``'s ``mat1``, ``MmBackward0``'s
``self``, through ``graphpaths.saved``: nothing saved under saved-tensor hooks is unpacked), and
each column of such an (N, F) input, F >= 2, is compared with the target: a copy of its values
(to float rounding; a target that is a noiseless function of one feature is a toy task, left
alone). A match becomes a ``target_in_inputs`` aside
event at the loss call. Autoencoders (a target of several values per sample) are not looked at.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .recorder import Recorder

_CALLS = 8  # loss calls with a gradient looked at
_MIN_ROWS = 8  # samples a column is compared on, at least
_NODES = 64  # nodes walked from the prediction toward its first layers
_MAX_COLUMNS = 4096
_INPUTS = {"AddmmBackward0": "_saved_mat1", "MmBackward0": "_saved_self"}


def _weight_of(node):
    """The parameter leaf a matrix product's weight side reaches (through ``W.t()``), or None."""
    for child, _ in node.next_functions:
        while child is not None and type(child).__name__ in ("TBackward0", "TransposeBackward0"):
            child = child.next_functions[0][0] if child.next_functions else None
        if child is not None and type(child).__name__ == "AccumulateGrad":
            return child
    return None


def _data_inputs(root) -> list:
    """The (N, F) inputs without gradient of the first matrix products below ``root``; not
    those of a layer used several times in the graph (a recurrent cell unrolled over time reads
    each step's input: a memory task's target is its first input on purpose)."""
    found, seen, queue, uses = [], set(), [root], {}
    while queue and len(seen) < _NODES:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        name = _INPUTS.get(type(node).__name__)
        if name is not None:
            weight = _weight_of(node)
            uses[weight] = uses.get(weight, 0) + 1
            value = saved(node, name)
            if isinstance(value, torch.Tensor) and not value.requires_grad and value.dim() == 2:
                found.append((value, weight))
        queue.extend(child for child, _ in node.next_functions)
    return [value for value, weight in found if weight is None or uses.get(weight, 0) < 2]


def matching_column(x, target) -> int | None:
    """The first column of ``x`` (N, F), F >= 2, that holds the target's
    values (to float rounding), or None. A copy only: a target that is a noiseless function of
    one feature (``y = 3 * x[:, 0]``) is a toy task, not a leak."""
    if not 2 <= x.shape[1] <= _MAX_COLUMNS:
        return None
    t = target.detach().reshape(-1).to(torch.float64)
    cols = x.detach().to(torch.float64)
    if t.numel() != cols.shape[0] or t.numel() < _MIN_ROWS or bool((t == t[0]).all()):
        return None  # a constant target says nothing
    close = ((cols - t[:, None]).abs() <= 1e-6 * (1.0 + t[:, None].abs())).all(0)
    hits = close.nonzero().flatten().tolist()
    return int(hits[0]) if hits else None


def _window(x) -> bool:
    """Whether the columns of ``x`` (N, F) are the steps of a series (a sliding window): each
    column nearer the next one than a column half the row away, on average, by a wide margin."""
    F = int(x.shape[1])
    if F < 4:
        return False
    cols = x.detach().to(torch.float64)
    near = (cols[:, 1:] - cols[:, :-1]).abs().mean()
    far = (cols[:, F // 2:] - cols[:, :F - F // 2]).abs().mean()
    return bool(far > 0) and bool(near < 0.5 * far)


class TargetColumnWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._calls = 0
        self._told: set = set()

    @property
    def open(self) -> bool:
        return self._calls < _CALLS

    def loss_call(self, fn: str, input, target) -> None:
        """A wrapped loss function called with a gradient: its prediction and target."""
        self._calls += 1
        try:
            if not (isinstance(target, torch.Tensor) and isinstance(input, torch.Tensor)
                    and target.device.type == "cpu" and input.grad_fn is not None
                    and target.dim() in (1, 2) and target.shape[0] >= _MIN_ROWS
                    and target.numel() == target.shape[0] and not target.is_complex()):
                return
            for x in _data_inputs(input.grad_fn):
                if x.device.type != "cpu" or x.shape[0] != target.shape[0]:
                    continue
                with torch.no_grad():
                    hit = matching_column(x, target)
                if hit is None:
                    continue
                loc = self.rec.here()
                if loc in self._told:
                    return
                self._told.add(loc)
                with torch.no_grad():
                    window = _window(x)
                self.rec.emit_aside(ev.target_in_inputs(fn=fn, column=hit, columns=int(x.shape[1]),
                                                        window=window), loc)
                return
        except Exception as exc:
            self.rec.internal_error(f"F.{fn} target in the inputs", exc)
