"""Parameters edited in place between two backwards whose gradients add up in one update: the
step applies the sum of gradients taken at two different points.

SAM (and ASAM, GSAM, any "ascend, then take the gradient there" scheme) computes ``g(w)``, moves
the weights to ``w + e`` in place, and backpropagates again: the update must use ``g(w + e)``
alone. Without a clear between the two backwards (``optimizer.zero_grad()`` before the second
one, or ``first_step(zero_grad=True)``) the second backward adds onto the first, and the step
applies ``g(w) + g(w + e)``: plain SGD with twice the learning rate and a perturbation noise,
no sharpness term at all. The same holds for any in-place edit of the stepped weights
between two accumulated backwards that the script did not mean to sum over.

At each of the first ``_LOOKED`` backwards (``DESCRIBE_LOSS``, before it runs) a strided sample
(``_VALUES`` values) of up to ``_TENSORS`` optimizer-owned CPU parameters is taken and compared
with the sample taken at the previous backward, when no optimizer step ran in between (a step
forgets the sample). When at least half of the sampled parameters changed in between (a
pruning mask re-applied to weights already masked changes nothing; ``nn.Embedding(max_norm=)``
renormalising a few rows changes one tensor of many), a ``weights_edited`` aside names them,
with the previous backward's line (loc: the backward about to run). Whether that backward adds
onto the gradients the earlier one left is the ``backward`` event's ``accumulated`` list, which
the rule (rules/grads_accumulated_across_weight_edit.py) reads.

When an update saw such an edit, the optimizer step that ends it (``STEP_BEGINS``, before
the parameters change) samples the edited parameters again: when at least half of them still
hold the values of the backward that saw the edit, and not those of the update's first
backward, a ``weights_edit_kept`` aside (loc: the step) says the edit was never undone (SAM's
``w + e`` kept: the base step starts from the perturbed weights), read by
rules/perturbation_not_undone.py.

Cost: at the first ``_LOOKED`` backwards, one small strided copy per sampled parameter (CPU
parameters only: no device read) and a comparison; at a step, a dict test, and the same copy
of the edited parameters after an update that saw an edit; nothing after them.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEP_BEGINS, STEPPED

_LOOKED = 16  # backwards looked at
_TENSORS = 16  # optimizer-owned parameters sampled at each
_VALUES = 32  # values sampled per parameter (evenly spaced)
_TOLD = 4  # asides at most


def _sample(tensor) -> torch.Tensor | None:
    if tensor is None or tensor.device.type != "cpu" or not tensor.is_floating_point() \
            or tensor.numel() == 0 or not tensor.is_contiguous():
        return None
    flat = tensor.detach().view(-1)
    stride = max(1, flat.numel() // _VALUES)
    return flat[::stride][:_VALUES].clone()


class WeightEditWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self._owned = owned  # read-only view of the optimizer-owned pids
        self._looked = 0
        self._told = 0
        self._previous: dict[int, torch.Tensor] | None = None  # samples at the previous backward
        self._previous_loc = None
        self._origin: dict[int, torch.Tensor] | None = None  # samples at the update's first backward
        self._edited = None  # (samples, loc) of the backward that saw an edit in this update
        self._kept_told = 0
        self._retired = False  # the backwards are no longer looked at
        self._steps = 0  # steps begun

    def after_step(self, opt, optimizer) -> None:
        self._previous = None  # the step moved the weights: that is no edit of the script's
        self._origin = self._edited = None

    def before_step(self, opt, optimizer) -> None:
        self._steps += 1
        if self._edited is None:
            if self._retired or self._steps >= _LOOKED:  # the backwards looked at are past
                self.rec.retire(STEP_BEGINS, self.before_step)
            return
        edited, self._edited = self._edited, None
        if self._retired:
            self.rec.retire(STEP_BEGINS, self.before_step)
        if self._kept_told >= _TOLD:
            return
        try:
            self._kept(*edited)
        except Exception as exc:
            self.rec.internal_error("weights_edit_kept", exc)

    def _kept(self, edited: dict, edited_loc) -> None:
        origin = self._origin or {}
        tensors = self.rec.tensors
        with torch.no_grad():
            compared, kept = 0, []
            for pid, values in edited.items():
                now = _sample(tensors.object(pid))
                if now is None or now.shape != values.shape or pid not in origin:
                    continue
                compared += 1
                if torch.equal(now, values) and not torch.equal(now, origin[pid]):
                    kept.append(pid)
        if not kept or 2 * len(kept) < compared:
            return
        self._kept_told += 1
        at = None if edited_loc is None else [edited_loc.path, edited_loc.line]
        self.rec.emit_aside(ev.weights_edit_kept(params=kept[:64], sampled=compared, edited_at=at),
                            self.rec.here())

    def _done(self) -> None:
        self._retired = True
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        if self._edited is None:  # else the step that ends this update still looks
            self.rec.retire(STEP_BEGINS, self.before_step)
        self.rec.retire(STEPPED, self.after_step)

    def describe_loss(self, tensors) -> dict:
        if self._looked >= _LOOKED or self._told >= _TOLD:
            self._done()
            return {}
        self._looked += 1
        try:
            self._look()
        except Exception as exc:
            self._done()
            self.rec.internal_error("weights_edited", exc)
        return {}

    def _look(self) -> None:
        rec = self.rec
        tensors = rec.tensors
        samples: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for pid in sorted(self._owned)[:_TENSORS]:
                values = _sample(tensors.object(pid))
                if values is not None:
                    samples[pid] = values
            loc = rec.here()
            base, base_loc = self._previous, self._previous_loc
            self._previous, self._previous_loc = samples, loc
            if base is None:
                self._origin = samples  # the first backward since the last step
            if not base or not samples:
                return
            common = [pid for pid in samples if pid in base and base[pid].shape == samples[pid].shape]
            moved = [pid for pid in common if not torch.equal(base[pid], samples[pid])]
        if not moved or 2 * len(moved) < len(common):
            return
        self._edited = ({pid: samples[pid] for pid in moved}, loc)
        self._told += 1
        before = None if base_loc is None else [base_loc.path, base_loc.line]
        rec.emit_aside(ev.weights_edited(params=moved[:64], sampled=len(common), before=before), loc)

    def install(self, patcher) -> None:
        pass
