from __future__ import annotations

import math

from ..findings import Severity
from .base import Rule, related

RUN = 3  # consecutive updates whose gradient norm grew by GROWTH or more
GROWTH = 3.0
TOTAL = 1e3  # and grew this much over them in all


class UpdatesDiverge(Rule):
    """
    ## What it does
    Finds an optimizer whose total gradient norm grows geometrically from update to update: at
    least three updates in a row, each with a gradient at least 3x the one before and 1000x in
    all. Read from the gradient norms the optimizer watcher measures at each step.

    ## Why is this bad?
    Each step overshoots the minimum it moves toward and lands where the gradient is larger,
    so the next step overshoots more: the loss explodes and turns into inf and NaN a few dozen
    steps later, long after the cause. The usual causes are a learning rate too high for the
    loss's scale, a loss summed over a large batch (`reduction="sum"`: its gradient grows with
    the batch size) and unnormalised inputs or targets.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = F.mse_loss(model(x), y, reduction="sum")  # 4096 samples
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = F.mse_loss(model(x), y)  # the mean: the gradient does not grow with the batch
    ```

    ## Stays silent on
    Gradients that grow for a step or two (a warm-up, a zero-initialised layer coming to
    life), that grow slowly (a deep network leaving a small initialisation), or that shrink
    again; updates whose norms were not measured (vouched by a clip or a GradScaler).
    """

    code = "GD142"
    slug = "updates-diverge"
    severity = Severity.WARNING
    summary = ("the gradient norm grows several-fold at every update: the steps overshoot and "
               "diverge (inf/NaN follows), usually an lr too high for the loss's scale")
    fix = "lower the learning rate, or normalise the loss (reduction='mean') and the inputs"

    def check(self, a):
        begins: dict[int, object] = {}
        series: dict[int, list] = {}  # opt -> [(step, total norm, lrs, backward)]
        last_backward = None
        for e in a.events:
            if e.kind == "backward":
                last_backward = e
            elif e.kind == "step_begin":
                begins[e.get("opt")] = e
            elif e.kind == "step" and not e.get("skipped") and not e.get("closure"):
                begin = begins.pop(e.get("opt"), None)
                norms = begin.get("norms") if begin is not None else None
                total = None
                if norms and all(isinstance(n, (int, float)) and math.isfinite(n) for n in norms):
                    total = math.sqrt(sum(n * n for n in norms))
                series.setdefault(e.get("opt"), []).append(
                    (e, total, begin.get("lrs") if begin is not None else None, last_backward))
        for opt, points in series.items():
            found = _diverging(a, points)
            if found is None:
                continue
            first, last = found
            step0, norm0, lrs, backward = points[first]
            step1, norm1 = points[last][0], points[last][1]
            factor = (norm1 / norm0) ** (1 / (last - first)) if norm0 > 0 else math.inf
            summed = backward is not None and "sum" in (backward.get("loss_terms") or ())
            lr = lrs[0] if lrs and isinstance(lrs[0], (int, float)) else None
            lr_text = f" (lr={lr:g}: try {lr / 10:g})" if lr else ""
            if summed:
                fix = (f"the loss is summed over the batch (reduction='sum'), so its gradient grows "
                       f"with the batch size: use reduction='mean' or divide by the batch size, or "
                       f"lower the learning rate{lr_text}")
            else:
                fix = (f"lower the learning rate{lr_text}, or normalise the inputs and targets "
                       f"(clipping the gradient norm only hides it)")
            n0, n1 = a.step_number.get(step0.seq), a.step_number.get(step1.seq)
            yield self.finding(
                f"the gradient norm of {a.optimizer_name(opt)} grows about {factor:.3g}x per update "
                f"over updates {n0}-{n1} ({norm0:.3g} -> {norm1:.3g}): each step overshoots and "
                f"lands where the gradient is larger, so the updates diverge (the loss explodes, "
                f"then turns inf/NaN)",
                backward.loc if backward is not None else step0.loc,
                related=(related(step0, "the first diverging update"),),
                step=n0, evidence={"norms": [norm0, norm1], "factor": factor, "summed": summed},
                fix=fix)


def _diverging(a, points: list) -> tuple[int, int] | None:
    """The first and last index of the first run of ``RUN`` or more consecutive updates (one
    step number apart, each norm measured) whose norm grew ``GROWTH``-fold or more each, and
    ``TOTAL``-fold over the run; None when there is none."""
    start = None
    for i in range(1, len(points) + 1):
        grew = False
        if i < len(points):
            (s0, n0, _, _), (s1, n1, _, _) = points[i - 1], points[i]
            k0, k1 = a.step_number.get(s0.seq), a.step_number.get(s1.seq)
            grew = (n0 is not None and n1 is not None and n0 > 0 and k0 is not None
                    and k1 == k0 + 1 and n1 >= GROWTH * n0)
        if grew:
            start = i - 1 if start is None else start
            continue
        if start is not None:
            first, last = start, i - 1
            if last - first >= RUN and points[last][1] >= TOTAL * points[first][1]:
                return first, last
            start = None
    return None
