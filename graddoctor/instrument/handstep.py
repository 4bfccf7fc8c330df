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

The same samples give the update's size: where the change of every sampled tensor (plain leaf
tensors too, ``w`` and ``b`` of a model written by hand) is the gradient times one negative
number (cosine below ``-PLAIN_SGD``: plain SGD, no momentum, no per-element scaling), that
number, ``-(change . grad) / (grad . grad)``, is the step size the update applied (``scale``:
``lr / batch_size`` for ``p -= lr * p.grad / batch_size``).
"""

from __future__ import annotations

import torch

_UPDATES = 4  # hand-written updates measured per run
_BACKWARDS = 64  # backwards sampled at most, measured or not
_TENSORS = 8  # parameters sampled
_SAMPLE = 256  # elements of each
_PLAIN_TENSORS = 8  # plain tensors (not nn.Parameter) sampled, for the update's size only
PLAIN_SGD = 0.999  # |cosine| above which an update is the gradient times one number


class HandStepDirection:
    def __init__(self):
        self._samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # pid -> (values, grad)
        self._plain: set[int] = set()  # the sampled pids that are no nn.Parameter
        self._measured = 0  # updates whose cosine was measured
        self._sized = 0  # updates whose size was looked at (any sampled tensor)
        self._backwards = 0
        self.scale: float | None = None  # the last observe's step size, when plain SGD

    @property
    def done(self) -> bool:
        return self._measured >= _UPDATES or self._backwards >= _BACKWARDS or (
            self._sized >= _UPDATES and len(self._plain) == len(self._samples))

    def observe(self, pids, tensors, updated) -> float | None:
        """After a backward that wrote the gradients of ``tensors`` (no optimizer owns them):
        the cosine between the last update of the ``nn.Parameter``s in ``updated`` and the
        gradient it applied, or None; ``scale`` set to the step size of that update over every
        sampled tensor when it is plain SGD (else None); then the samples of the gradients this
        backward wrote."""
        self.scale = None
        if self.done:
            return None
        self._backwards += 1
        samples, plain = self._samples, self._plain
        deltas: list = []
        applied: list = []
        plain_deltas: list = []
        plain_applied: list = []
        with torch.no_grad():
            for pid, tensor in zip(pids, tensors):
                kind = type(tensor)
                if (kind is not torch.nn.Parameter and kind is not torch.Tensor) \
                        or tensor.device.type != "cpu" or not tensor.is_floating_point():
                    continue
                is_plain = kind is torch.Tensor
                grad = tensor.grad
                if type(grad) is not torch.Tensor or grad.layout != torch.strided \
                        or grad.shape != tensor.shape:
                    continue
                values = tensor.detach().reshape(-1)[:_SAMPLE]
                before = samples.get(pid)
                if before is not None and pid in updated:
                    (plain_deltas if is_plain else deltas).append(values.double() - before[0])
                    (plain_applied if is_plain else applied).append(before[1])
                if before is not None or (len(plain) < _PLAIN_TENSORS if is_plain
                                          else len(samples) - len(plain) < _TENSORS):
                    samples[pid] = (values.to(torch.float64, copy=True),  # copies, never views
                                    grad.detach().reshape(-1)[:_SAMPLE].to(torch.float64, copy=True))
                    if is_plain:
                        plain.add(pid)
            if not deltas and not plain_deltas:
                return None
            delta, grad = torch.cat(deltas + plain_deltas), torch.cat(applied + plain_applied)
            square = float(grad @ grad)
            scale = float(delta.norm()) * square ** 0.5
            if scale > 0.0:
                along = float(delta @ grad)
                if along / scale < -PLAIN_SGD:
                    self.scale = -along / square
            self._sized += 1
            if not deltas:
                return None
            delta, grad = torch.cat(deltas), torch.cat(applied)
            scale = float(delta.norm() * grad.norm())
            if not scale > 0.0:
                return None
            self._measured += 1
            return float(delta @ grad) / scale
