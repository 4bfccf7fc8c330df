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
At the same step, the stepped parameters are compared with each other: two distinct tensors of one
shape whose values are equal, and whose gradients are equal and not all zero, are copies that will
never diverge (an ensemble or a set of heads built by ``copy.deepcopy`` of one initialised module and
fed the same data). Tensors are grouped by a fingerprint (shape, dtype, a few sampled values of the
tensor and its gradient), then confirmed with ``torch.equal``: one small read per tensor, once.
Parameters whose own rows are copies are left to the row check above (a constant initialisation
makes whole layers equal too; it is the cause to report).
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


_SAMPLES = 8  # values of each tensor and of its gradient in the fingerprint


def _comparable(param: torch.Tensor) -> bool:
    grad = param.grad
    return (param.numel() >= 2 and type(grad) is torch.Tensor and grad.layout == torch.strided
            and grad.shape == param.shape and param.device.type == "cpu"
            and param.is_floating_point() and grad.is_floating_point())


def identical_copies(params: dict[int, torch.Tensor]) -> list[list[int]]:
    """Groups (two or more, in the given order) of distinct tensors with equal values and equal
    gradients, the gradient not all zero. Tensors sharing memory (tied weights) are one tensor."""
    buckets: dict[tuple, list[int]] = {}
    with torch.no_grad():
        for pid, param in params.items():
            if not _comparable(param):
                continue
            n = param.numel()
            stride = max(1, n // _SAMPLES)
            key = (tuple(param.shape), param.dtype,
                   tuple(param.reshape(-1)[::stride][:_SAMPLES].tolist()),
                   tuple(param.grad.reshape(-1)[::stride][:_SAMPLES].tolist()))
            buckets.setdefault(key, []).append(pid)
        groups = []
        for pids in buckets.values():
            if len(pids) < 2:
                continue
            left = list(pids)
            while len(left) >= 2:
                head, rest = left[0], left[1:]
                first = params[head]
                if first.data_ptr() in {params[q].data_ptr() for q in rest}:
                    left = [q for q in rest if params[q].data_ptr() != first.data_ptr()]
                    continue
                same = [q for q in rest if torch.equal(params[q], first)
                        and torch.equal(params[q].grad, first.grad)]
                if same and bool(first.grad.any()):
                    groups.append([head] + same)
                left = [q for q in rest if q not in same]
        return groups


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
            symmetric = {p for p, _ in found}
            stepped = {pid: param for pid in rec.opt_params.get(opt, ())
                       if pid not in symmetric and (param := tensor(pid)) is not None}
            copies = identical_copies(stepped)
            # a weight matrix among them: equal vectors alone are no copied module (the biases
            # of two branches summed into one output get one gradient, whatever the branches)
            if copies and any(stepped[group[0]].dim() >= 2 for group in copies):
                rec.emit_aside(ev.copies_identical(opt=opt, groups=copies, step=done), rec.here(2))
        except Exception as exc:
            rec.internal_error("symmetric units", exc)
