"""How much of an adaptive optimizer's denominator is its ``eps``, from its own state, over its
first updates.

Adam, AdamW, NAdam, RAdam, RMSprop and Adagrad divide each element's step by
``sqrt(v) + eps``, where ``v`` is their running estimate of the gradient's square. When ``eps``
is many times ``sqrt(v)`` the division is by ``eps`` alone: the step is ``lr × m / eps``, plain
(momentum) SGD at an lr of ``lr / eps``, and the per-element normalisation the optimizer was
chosen for is gone. Whether that happens depends on the gradients' scale, not on ``eps``
alone (``eps=1e-3`` is harmless next to gradients of 1; ``eps=1`` dominates gradients of 1e-2),
so it is read from the state after each of the first ``MEASURED`` steps of each of torch's own
such optimizers (the ``STEPPED`` topic):

* ``v`` is the state's estimate as the step used it: Adam's ``exp_avg_sq`` (``max_exp_avg_sq``
  under amsgrad) and RMSprop's ``square_avg`` (less ``grad_avg²`` when centered) divided by
  their bias correction ``1 - beta2^t`` (RMSprop's own step does not correct it, but its
  average approaches that value within a few hundred steps: judging the uncorrected early value
  would take a warm-up effect for the steady state), Adagrad's ``sum``;
* per CPU floating parameter of a param group whose ``eps`` is at least ``EPS_FLOOR``, the
  share of its elements with ``v > 0`` (an element that never had a gradient is not moved
  either way) where ``eps ≥ DOMINATES × sqrt(v)``, and the median ``eps / sqrt(v)`` of those;
* the group's ``share``: the fraction of its measured elements that lie in parameters where
  that share is a majority, and the element-weighted median ratio.

One ``eps_share`` aside per group once the updates are measured (at the end of the run for
an optimizer that stepped fewer times). Only the optimizer's state is
read (never written); after the measured updates a step costs one dict lookup here.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .optim import plain_number
from .recorder import Recorder
from .decay import _weighted_median
from .optwindow import PerOptimizerWindow
from .topics import STEPPED

MEASURED = 3  # steps measured per optimizer
DOMINATES = 10.0  # eps this many times sqrt(v): the denominator is eps within 10 %
# eps below this is torch's defaults' range (1e-8 .. 1e-6, Adagrad's 1e-10): never judged, a
# gradient small enough for it to dominate moves nothing either way
EPS_FLOOR = 1e-5

# class -> (state key of v, key of the decay rate in the group, its index in that value)
_SECOND_MOMENT = {
    "Adam": ("exp_avg_sq", "betas", 1), "AdamW": ("exp_avg_sq", "betas", 1),
    "NAdam": ("exp_avg_sq", "betas", 1), "RAdam": ("exp_avg_sq", "betas", 1),
    "RMSprop": ("square_avg", "alpha", None), "Adagrad": ("sum", None, None),
}


def _own_class(optimizer) -> str | None:
    cls = type(optimizer)
    name = cls.__name__
    if name in _SECOND_MOMENT and (getattr(cls, "__module__", None) or "").startswith("torch.optim"):
        return name
    return None


def _estimate(cls: str, group: dict, state: dict) -> torch.Tensor | None:
    """The second-moment estimate ``v`` the step divides by (see the module docs), or None."""
    key, rate_key, index = _SECOND_MOMENT[cls]
    if cls in ("Adam", "AdamW") and group.get("amsgrad") and "max_exp_avg_sq" in state:
        key = "max_exp_avg_sq"
    v = state.get(key)
    if type(v) is not torch.Tensor or v.device.type != "cpu" or not v.is_floating_point() \
            or v.layout != torch.strided:
        return None
    v = v.detach()
    if rate_key is None:
        return v
    rate = group.get(rate_key)
    if index is not None:
        rate = rate[index] if isinstance(rate, (tuple, list)) and len(rate) > index else None
    rate = plain_number(rate)
    step = state.get("step")
    t = float(step) if isinstance(step, (int, float)) or (
        type(step) is torch.Tensor and step.device.type == "cpu" and step.numel() == 1) else None
    if rate is None or t is None or t < 1 or not 0 <= rate < 1:
        return None
    correction = 1.0 - rate ** t
    if correction <= 0:
        return None
    v = v / correction
    if cls == "RMSprop" and group.get("centered"):
        mean = state.get("grad_avg")
        if type(mean) is not torch.Tensor or mean.shape != v.shape:
            return None
        v = (v - (mean.detach() / correction) ** 2).clamp_min(0.0)
    return v


class EpsShareWatcher(PerOptimizerWindow):
    topic, label = STEPPED, "eps share"
    # _groups: opt -> [[group index, eps, [steps], [shares], [ratios]]]

    def __init__(self, rec: Recorder):
        super().__init__(rec, self.after_step)
        self._classes: dict[int, str] = {}

    def after_step(self, opt: int, optimizer) -> None:
        self._on_step(opt, optimizer)

    def _start(self, opt: int, optimizer) -> None:
        self._left[opt] = 0
        cls = _own_class(optimizer)
        groups = getattr(optimizer, "param_groups", None)
        if cls is None or type(groups) is not list:
            return
        self._classes[opt] = cls
        measured = []
        for index, group in enumerate(groups):
            eps = plain_number(group.get("eps")) if type(group) is dict else None
            if eps is not None and eps >= EPS_FLOOR:
                measured.append([index, eps, [], [], []])
        if measured:
            self._groups[opt] = measured
            self._left[opt] = MEASURED

    def _measure(self, opt: int, optimizer) -> None:
        cls = _own_class(optimizer)
        groups = optimizer.param_groups
        state = optimizer.state
        step = self.rec.progress.steps
        for index, eps, steps, shares, ratios in self._groups[opt]:
            if cls is None or index >= len(groups):
                continue
            group = groups[index]
            dominated = total = 0
            medians, sizes = [], []
            with torch.no_grad():
                for p in group["params"]:
                    s = state.get(p)
                    if type(s) is not dict:
                        continue
                    v = _estimate(cls, group, s)
                    if v is None:
                        continue
                    v = v[v > 0]
                    size = v.numel()
                    if not size:
                        continue
                    root = v.sqrt()
                    share = float((eps >= DOMINATES * root).float().mean())
                    total += size
                    if 2 * share > 1:
                        dominated += size
                    medians.append(eps / max(float(root.median()), 1e-30))
                    sizes.append(size)
            if total:
                steps.append(step)
                shares.append(round(dominated / total, 4))
                ratios.append(round(_weighted_median(medians, sizes), 4))
        self._left[opt] -= 1
        if not self._left[opt]:
            self._emit(opt, cls or type(optimizer).__name__)

    def _emit(self, opt: int, cls: str) -> None:
        for index, eps, steps, shares, ratios in self._groups.pop(opt, ()):
            if steps:
                self.rec.emit_aside(ev.eps_share(opt=opt, cls=cls, group=index, eps=eps,
                                                 steps=steps, shares=shares, ratios=ratios))

    def close(self) -> None:
        """At the end of the run: the groups of optimizers that stepped fewer than
        ``MEASURED`` times, as far as they were measured."""
        try:
            for opt in list(self._groups):
                self._left[opt] = 0
                self._emit(opt, self._classes.get(opt, "?"))
        except Exception as exc:
            self.rec.internal_error("eps share", exc)
