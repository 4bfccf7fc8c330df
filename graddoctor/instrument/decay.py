"""How large each param group's weight decay is next to the loss's gradient in the update its
optimizer applies, over that optimizer's first updates.

torch's optimizers decay weights in one of two ways. Coupled (L2: SGD, Adam, RMSprop, Adagrad,
...) adds ``weight_decay * p`` to the gradient before the update rule reads it; when that term
is many times the loss's gradient, the update follows ``p`` (toward 0) and not the loss, and an
optimizer that normalises its input (Adam, RMSprop, Adagrad) steps ``lr * sign(p)`` whatever
the gradient. Decoupled (AdamW, ``decoupled_weight_decay=True``) multiplies the weights by
``1 - lr * weight_decay`` next to an Adam step that moves each weight by about ``lr`` at most:
the decay outweighs it when ``weight_decay * |p|`` is many times 1.

For each of torch's own optimizers, at its first ``MEASURED`` updates (outermost, not closure
steps), each param group with a weight decay is measured: per CPU parameter with a gradient,
the ratio of the decay term to the loss's (coupled: ``weight_decay * ||p|| / ||g||``;
decoupled: ``weight_decay * ||p|| / sqrt(numel)``, the decay over the unit an Adam step is
bounded by), and the group's element-weighted median of those ratios (half of its elements
lie in tensors whose ratio is at least that). One ``decay_share`` event per group once the
updates are measured. Parameters and gradients are only read (norms), never changed; once
every optimizer registered so far is measured (or has nothing to measure) the watcher leaves
``STEP_BEGINS`` until a new optimizer is registered (``PARAMS_ADDED``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .optim import plain_number
from .recorder import Recorder
from .optwindow import PerOptimizerWindow
from .topics import STEP_BEGINS

MEASURED = 3  # updates measured per optimizer

# torch's optimizers whose weight_decay adds weight_decay * p to the gradient (unless the group
# says decoupled_weight_decay=True), and the one whose decay is always decoupled
_COUPLED = frozenset({"SGD", "ASGD", "Adam", "NAdam", "RAdam", "Adamax", "RMSprop", "Adagrad",
                      "Adadelta"})
_DECOUPLED = frozenset({"AdamW"})


def _own_class(optimizer) -> str | None:
    """The class name when it is one of torch's optimizers with a known decay (a subclass of the
    script's may change the update rule: None)."""
    cls = type(optimizer)
    name = cls.__name__
    if (name in _COUPLED or name in _DECOUPLED) and \
            (getattr(cls, "__module__", None) or "").startswith("torch.optim"):
        return name
    return None


def _weighted_median(ratios: list[float], sizes: list[int]) -> float | None:
    """The ratio at or above which half of the elements lie (element-weighted median)."""
    total = sum(sizes)
    if total <= 0:
        return None
    seen = 0
    for ratio, size in sorted(zip(ratios, sizes), reverse=True):
        seen += size
        if 2 * seen >= total:
            return ratio
    return None


class DecayShareWatcher(PerOptimizerWindow):
    topic, label = STEP_BEGINS, "weight decay share"
    # _left: opt -> updates still to measure (0: done or not measured at all)
    # _groups: opt -> [(group index, weight_decay, lr, decoupled, [steps], [median ratios])]

    def __init__(self, rec: Recorder):
        super().__init__(rec, self.before_step)

    def before_step(self, opt: int, optimizer) -> None:
        self._on_step(opt, optimizer)

    def _start(self, opt: int, optimizer) -> None:
        self._left[opt] = 0
        cls = _own_class(optimizer)
        groups = getattr(optimizer, "param_groups", None)
        if cls is None or type(groups) is not list:
            return
        measured = []
        for index, group in enumerate(groups):
            if type(group) is not dict:
                continue
            decay = plain_number(group.get("weight_decay"))
            if not decay or decay <= 0:
                continue
            decoupled = cls in _DECOUPLED or group.get("decoupled_weight_decay") is True
            measured.append([index, decay, plain_number(group.get("lr")), decoupled, [], []])
        if measured:
            self._groups[opt] = measured
            self._left[opt] = MEASURED

    def _measure(self, opt: int, optimizer) -> None:
        groups = optimizer.param_groups
        measured = self._groups[opt]
        step = self.rec.progress.steps + 1
        for entry in measured:
            index, decay, _, decoupled, steps, medians = entry
            if index >= len(groups):
                continue
            params, grads = [], []
            for p in groups[index]["params"]:
                g = p.grad
                if g is None or type(g) is not torch.Tensor or g.layout != torch.strided \
                        or g.device.type != "cpu" or not g.is_floating_point() or p.numel() == 0:
                    continue
                params.append(p.detach())
                grads.append(g.detach())
            if not params:
                continue
            with torch.no_grad():
                p_norms = [float(n) for n in torch._foreach_norm(params)]
                g_norms = None if decoupled else [float(n) for n in torch._foreach_norm(grads)]
            ratios, sizes = [], []
            for i, p in enumerate(params):
                size = p.numel()
                if decoupled:
                    ratios.append(decay * p_norms[i] / size ** 0.5)
                elif g_norms[i] > 0.0:  # a zero gradient says nothing of the loss's share
                    ratios.append(decay * p_norms[i] / g_norms[i])
                else:
                    continue
                sizes.append(size)
            median = _weighted_median(ratios, sizes)
            if median is not None:
                steps.append(step)
                medians.append(round(median, 6))
        self._left[opt] -= 1
        if self._left[opt]:
            return
        cls = type(optimizer).__name__
        for index, decay, lr, decoupled, steps, medians in self._groups.pop(opt):
            if steps:
                self.rec.emit_aside(ev.decay_share(
                    opt=opt, cls=cls, group=index, weight_decay=decay, lr=lr,
                    decoupled=decoupled, steps=steps, ratios=medians))
