"""Which way a hand-written update moves a model's parameters: against the gradient it applied
(descent), or along it (ascent: `p += lr * p.grad`).

The backward watcher already tells a hand-written update (tensors no optimizer owns, changed
since a backward last wrote their gradient). For the first few such updates it keeps a sample of
each module parameter's values and gradient after every backward (the first ``_SAMPLE`` elements
of at most ``_TENSORS`` parameters) and, at the backward after an update, measures the cosine
between the change of the values and the gradient the update applied: about -1 for SGD, negative
for momentum or Adam, about +1 for an update that adds the gradient. Only ``nn.Parameter``s on
the CPU are sampled: a perturbation optimised against a model (a plain tensor, PGD's ``delta``)
is meant to climb.
"""

from __future__ import annotations

import torch

_UPDATES = 4  # hand-written updates measured per run
_BACKWARDS = 64  # backwards sampled at most, measured or not
_TENSORS = 8  # parameters sampled
_SAMPLE = 256  # elements of each


class HandStepDirection:
    def __init__(self):
        self._samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # pid -> (values, grad)
        self._measured = 0
        self._backwards = 0

    @property
    def done(self) -> bool:
        return self._measured >= _UPDATES or self._backwards >= _BACKWARDS

    def observe(self, pids, tensors, updated) -> float | None:
        """After a backward that wrote the gradients of ``tensors`` (no optimizer owns them):
        the cosine between the last update of those in ``updated`` and the gradient it applied,
        or None; then the samples of the gradients this backward wrote."""
        if self.done:
            return None
        self._backwards += 1
        samples = self._samples
        deltas: list = []
        applied: list = []
        with torch.no_grad():
            for pid, tensor in zip(pids, tensors):
                if type(tensor) is not torch.nn.Parameter or tensor.device.type != "cpu" \
                        or not tensor.is_floating_point():
                    continue
                grad = tensor.grad
                if type(grad) is not torch.Tensor or grad.layout != torch.strided \
                        or grad.shape != tensor.shape:
                    continue
                values = tensor.detach().reshape(-1)[:_SAMPLE]
                before = samples.get(pid)
                if before is not None and pid in updated:
                    deltas.append(values.double() - before[0])
                    applied.append(before[1])
                if before is not None or len(samples) < _TENSORS:  # copies, never views
                    samples[pid] = (values.to(torch.float64, copy=True),
                                    grad.detach().reshape(-1)[:_SAMPLE].to(torch.float64, copy=True))
            if not deltas:
                return None
            delta, grad = torch.cat(deltas), torch.cat(applied)
            scale = float(delta.norm() * grad.norm())
            if not scale > 0.0:
                return None
            self._measured += 1
            return float(delta @ grad) / scale
