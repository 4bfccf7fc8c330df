"""By what constant a hand edit between ``backward()`` and ``optimizer.step()`` scaled the
gradients (``p.grad *= lr``, ``p.grad /= world_size``), per param group.

The optimizer watcher already tells which grads were changed in place by code it does not
watch (a ``grad_edit`` event). To say by how much, the backward watcher keeps, after each of the
run's first ``_BACKWARDS`` backwards, a sample of the gradients it wrote (the first ``_SAMPLE``
elements of at most ``_TENSORS`` CPU tensors, float64 copies); at the pre hook of one of the
first ``_EDITS`` steps with an edit right after such a backward, each edited grad's sample is
compared with what the backward left: when every sampled element of every sampled edited grad
of a param group is the same constant c times its value after the backward, that group's
factor is c (``grad_edit``'s ``factors``; None for a group with no such constant). A clip by
hand gives a factor too (max_norm / norm): the rules compare it with what they know.

Only CPU gradients are sampled (no device sync); a step whose grads were not all sampled, or
whose sample is older than the latest backward, gets no factors.

The same samples show edits the version counter does not: ``p.grad.data.zero_()`` or
``p.grad.data.mul_(lr)`` change the values through ``.data``, whose version counter is its own,
so the grad keeps the ``(id, _version)`` the backward left and looks untouched. At the step's
pre hook, a sampled grad that is still that tensor at that version but whose sampled values
differ was edited that way (``untracked``): the optimizer watcher counts it as edited, exactly
as ``p.grad.zero_()`` would be. Grads vouched by a watched op that changes values without a
version bump (``GradScaler.unscale_``) are compared with what that op left (``rebase``); a clip,
which changes them in place, first reports the ``.data`` edits made before it (its ``edited``) and
then moves the samples to what it left (``follow``). Once such an edit was seen
every later backward is sampled, so the script's every step is judged alike (its steps never go
onto the steady path: they are edited).
"""

from __future__ import annotations

import math
from itertools import compress

import torch

_BACKWARDS = 8  # backwards sampled at most
_EDITS = 4  # edited steps measured at most
_TENSORS = 16  # gradients sampled per backward
_SAMPLE = 64  # elements of each
_TOLERANCE = 1e-5  # relative spread of the ratios one factor allows


class EditFactors:
    """Samples written by the backward watcher (``observe``), read by the optimizer watcher's
    step pre hook (``factors``)."""

    def __init__(self):
        # pid -> (grad id, grad _version, values after the backward, values an untracked edit
        # is judged against: the same tensor, or what a watched unscale_ left)
        self._samples: dict[int, tuple[int, int, torch.Tensor, torch.Tensor]] = {}
        self._at = -1  # the backward count the samples were taken at
        self._backwards = 0
        self._edits = 0
        self.untracked_seen = False  # an edit through ``.data`` was found: sample every backward

    @property
    def done(self) -> bool:
        """Nothing more to sample (the first backwards' samples taken, or the edited steps
        measured), unless the script edits its grads through ``.data``."""
        return (self._backwards >= _BACKWARDS or self._edits >= _EDITS) and not self.untracked_seen

    def observe(self, backward_calls: int, pids, grads) -> None:
        """After a backward that wrote ``grads`` (parallel to ``pids``)."""
        if self.done:
            return
        self._backwards += 1
        samples: dict = {}
        with torch.no_grad():
            for pid, grad in zip(pids, grads):
                if len(samples) >= _TENSORS:
                    break
                if type(grad) is not torch.Tensor or grad.device.type != "cpu" \
                        or grad.layout != torch.strided or not grad.is_floating_point():
                    continue
                values = grad.detach().reshape(-1)[:_SAMPLE].to(torch.float64, copy=True)
                samples[pid] = (id(grad), grad._version, values, values)
        if samples:  # only this backward's: an older sample may be of a grad cleared since
            self._samples = samples
            self._at = backward_calls

    def factors(self, backward_calls: int, optimizer, owned, edited) -> list | None:
        """Each param group's factor (see module docs) at a step whose pre hook found the grads
        of ``edited`` changed by hand; ``owned``: the optimizer's pids in group order."""
        if self._edits >= _EDITS or self._at != backward_calls or not edited:
            return None
        self._edits += 1
        groups = getattr(optimizer, "param_groups", None)
        if type(groups) is not list:
            return None
        sizes = [len(g.get("params", ())) if type(g) is dict else 0 for g in groups]
        if sum(sizes) != len(owned):
            return None
        group_of: dict[int, int] = {}
        i = 0
        for g, size in enumerate(sizes):
            for pid in owned[i:i + size]:
                group_of[pid] = g
            i += size
        ratios: dict[int, list[float]] = {}
        params = _params_by_pid(groups, owned)
        with torch.no_grad():
            # every sampled grad the optimizer owns, edited or not: a group whose grads were
            # only partly scaled (an unedited one has ratio 1) has no single factor
            for pid in list(filter(self._samples.__contains__, owned)):
                sample = self._samples.get(pid)
                param = params.get(pid)
                if sample is None or param is None:
                    continue
                grad = param.grad
                if type(grad) is not torch.Tensor or grad.device.type != "cpu":
                    continue
                before = sample[2]
                now = grad.detach().reshape(-1)[:before.numel()].to(torch.float64)
                if now.numel() != before.numel():
                    continue
                keep = before != 0
                if not bool(keep.any()) or not bool((now[~keep] == 0).all()):
                    ratios.setdefault(group_of.get(pid, -1), []).append(math.nan)
                    continue
                r = now[keep] / before[keep]
                ratios.setdefault(group_of.get(pid, -1), []).extend(
                    (float(r.min()), float(r.max())))
        out: list = [None] * len(groups)
        for g, values in ratios.items():
            if g < 0 or not values or not all(map(math.isfinite, values)):
                continue
            low, high = min(values), max(values)
            if low != 0 and high - low <= _TOLERANCE * abs(high):
                out[g] = (low + high) / 2
        return out if any(f is not None for f in out) else None


    def sampled_at(self, backward_calls: int) -> bool:
        """Whether the latest backward (``backward_calls``) left samples to compare with."""
        return self._at == backward_calls and bool(self._samples)

    def rebase(self, pids, grads) -> None:
        """A watched op changed these grads in place without a version bump (``unscale_``):
        later untracked edits are judged against their values now."""
        samples = self._samples
        with torch.no_grad():
            for pid, grad in compress(zip(pids, grads), map(samples.__contains__, pids)):
                sample = samples.get(pid)
                if sample is None or type(grad) is not torch.Tensor or sample[0] != id(grad) \
                        or sample[1] != grad._version:
                    continue
                now = grad.detach().reshape(-1)[:sample[2].numel()].to(torch.float64, copy=True)
                samples[pid] = (*sample[:3], now)

    def follow(self, pids, grads) -> None:
        """A watched op changed these grads in place with a version bump (a clip): each sampled
        one is judged from now on at its new version and values (its values after the backward
        stay what ``factors`` compares with)."""
        samples = self._samples
        with torch.no_grad():
            for pid, grad in compress(zip(pids, grads), map(samples.__contains__, pids)):
                sample = samples.get(pid)
                if sample is None or type(grad) is not torch.Tensor or sample[0] != id(grad):
                    continue
                now = grad.detach().reshape(-1)[:sample[2].numel()].to(torch.float64, copy=True)
                samples[pid] = (sample[0], grad._version, sample[2], now)

    def untracked(self, backward_calls: int, pids, grads, skip) -> list[int]:
        """The pids among ``pids`` (their ``grads`` parallel) whose grad, sampled after the
        latest backward, is still the same tensor at the same version but holds other values
        now: edited through ``.data`` (see module docs). ``skip``: pids not to judge."""
        samples = self._samples
        if self._at != backward_calls or not samples:
            return []
        found = []
        with torch.no_grad():
            # the sampled pids only (at most _TENSORS), picked in C, in ``pids``' order
            for pid, grad in compress(zip(pids, grads), map(samples.__contains__, pids)):
                sample = samples.get(pid)
                if (sample is None or pid in skip or sample[0] != id(grad)
                        or sample[1] != grad._version):
                    continue
                before = sample[3]
                now = grad.detach().reshape(-1)[:before.numel()].to(torch.float64)
                if now.numel() == before.numel() and not _same_values(now, before):
                    found.append(pid)
        if found:
            self.untracked_seen = True
        return found


def _same_values(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Equal element for element, a NaN equal to a NaN (a NaN grad left alone is no edit)."""
    return torch.equal(now, before) or bool(((now == before) | (now.isnan() & before.isnan())).all())


def _params_by_pid(groups, owned) -> dict:
    flat = [p for g in groups if type(g) is dict for p in g.get("params", ())]
    return dict(zip(owned, flat)) if len(flat) == len(owned) else {}
