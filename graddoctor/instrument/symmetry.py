"""Layers whose units are copies of each other: identical weight rows that get identical gradients.

Every unit (row) of a layer sees the same input. If their weights start equal (a constant or an
all-zero initialisation) and the layers after them treat them alike, each unit also gets the same
gradient, so the rows stay equal at every update: the layer trains as if it had a single unit.
Random initialisation exists to break that symmetry; a later random layer breaks it too (the
units' gradients then differ), which is why both the weights and their gradients are compared.

Checked once per optimizer, after its ``CHECK_AT``-th step (two updates applied, the third's
gradient still in ``.grad``): for each stepped parameter with at least two rows (a Linear's or a
conv's output units, dim 0), whether every row of the weight equals the first (to 1e-4 of its
largest value: rows a blocked matmul computes apart differ in their last bits), and so does every
row of its gradient, which is not all zero (a zero gradient is grads-always-zero's). One
comparison per tensor, once; CPU tensors only (a read of a device tensor syncs the host).
Once every optimizer registered so far has been checked, the watcher leaves ``STEPPED``; a new
optimizer brings it back (``PARAMS_ADDED``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import PARAMS_ADDED, STEPPED

CHECK_AT = 3  # the optimizer step after which its parameters are compared


_RTOL = 1e-4  # rows computed apart (blocked matmuls) differ in their last bits


def _rows_equal(t: torch.Tensor) -> bool:
    rows = t.reshape(t.shape[0], -1).float()
    spread = (rows - rows[:1]).abs().amax()
    return bool(spread <= _RTOL * rows[:1].abs().amax())


def symmetric_rows(param: torch.Tensor) -> bool:
    """The parameter's rows are all equal, and so are its gradient's, which is not all zero."""
    grad = param.grad
    if (param.dim() < 2 or param.shape[0] < 2 or param.numel() == param.shape[0]
            or type(grad) is not torch.Tensor or grad.layout != torch.strided
            or grad.shape != param.shape or param.device.type != "cpu"
            or not (param.is_floating_point() and grad.is_floating_point())):
        return False
    with torch.no_grad():
        return _rows_equal(param) and _rows_equal(grad) and bool(grad.any())


class SymmetryWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._steps: dict[int, int] = {}  # opt -> steps seen, up to CHECK_AT
        rec.subscribe(STEPPED, self.after_step)
        rec.subscribe(PARAMS_ADDED, self.params_added)

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def params_added(self, opt: int, pids) -> None:
        """``PARAMS_ADDED``: an optimizer not checked yet: back on ``STEPPED``."""
        if self._steps.get(opt, 0) < CHECK_AT:
            self.rec.resume(STEPPED, self.after_step)

    def after_step(self, opt: int, optimizer) -> None:
        done = self._steps.get(opt, 0)
        if done >= CHECK_AT:
            return
        self._steps[opt] = done = done + 1
        if done < CHECK_AT:
            return
        rec = self.rec
        steps = self._steps
        if all(steps.get(other, 0) >= CHECK_AT for other in rec.opt_params):
            rec.retire(STEPPED, self.after_step)  # each optimizer checked: nothing left to do
        try:
            tensor = rec.tensor
            found = [(pid, param.shape[0]) for pid in rec.opt_params.get(opt, ())
                     if (param := tensor(pid)) is not None and symmetric_rows(param)]
            if found:
                rec.emit_aside(ev.symmetric_units(opt=opt, params=[p for p, _ in found],
                                                  rows=[n for _, n in found], step=done),
                               rec.here(2))
        except Exception as exc:
            rec.internal_error("symmetric units", exc)
