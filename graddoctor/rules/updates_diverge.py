from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

class UpdatesDiverge(Rule):
    """
    ## What it does
    Finds an optimizer whose total gradient norm grows geometrically from update to update: at
    least three updates in a row, each with a gradient at least 3x the one before and 1000x in
    all. Seen while recording (instrument/divergence.py, from the norms the optimizer watcher
    measures at each step), so a folded trace loses nothing.

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
        for event in a.by_kind.get("diverging", ()):
            if event.get("nonfinite"):
                continue  # a NaN right after two growing updates: nonfinite-grad names it
            opt = event.get("opt")
            if _explained(a, opt):
                continue
            backward, begin = _around(a, event)
            summed = backward is not None and "sum" in (backward.get("loss_terms") or ())
            lr_text = lower_lr(begin.get("lrs") if begin is not None else None)
            if summed:
                fix = (f"the loss is summed over the batch (reduction='sum'), so its gradient grows "
                       f"with the batch size: use reduction='mean' or divide by the batch size, or "
                       f"lower the learning rate{lr_text}")
            else:
                fix = (f"lower the learning rate{lr_text}, or normalise the inputs and targets "
                       f"(clipping the gradient norm only hides it)")
            first, last = event.get("norms") or (None, None)
            yield self.finding(
                f"the gradient norm of {a.optimizer_name(opt)} grows about "
                f"{event.get('factor'):.3g}x per update over its updates {event.get('first')}-"
                f"{event.get('last')} ({first:.3g} -> {last:.3g}): each step overshoots and lands "
                f"where the gradient is larger, so the updates diverge (the loss explodes, then "
                f"turns inf/NaN)",
                backward.loc if backward is not None else None,
                related=(related(begin, "the update where it was seen"),),
                step=a.next_step_number(event.seq),
                evidence={"norms": [first, last], "factor": event.get("factor"), "summed": summed},
                fix=fix)


def _explained(a, opt: int) -> bool:
    """Growth another rule names the cause of: a loss scaled by hand or by a GradScaler
    (loss-scale-not-undone, step-bypasses-scaler) or a momentum/betas outside the update rule's
    range (hyperparameter-out-of-range)."""
    for b in a.by_kind.get("backward", ()):
        factor = b.get("loss_scale_factor")
        if b.get("scaled") or (isinstance(factor, (int, float)) and factor >= 2.0):
            return True
    for e in a.by_kind.get("optimizer_init", ()):
        if e.get("opt") != opt:
            continue
        for hyper in e.get("hyper") or ():
            hyper = hyper or {}
            momentum, betas = hyper.get("momentum"), hyper.get("betas")
            if isinstance(momentum, (int, float)) and momentum >= 1:
                return True
            if betas and len(betas) == 2 and betas[0] ** 2 >= betas[1]:
                return True
    return False


def _around(a, event) -> tuple:
    """The backward before a ``diverging`` event and its optimizer's ``step_begin`` after it."""
    i = a.events.index(event)
    backward = next((e for e in reversed(a.events[:i]) if e.kind == "backward"), None)
    begin = next((e for e in a.events[i + 1:] if e.kind == "step_begin"
                  and e.get("opt") == event.get("opt")), None)
    return backward, begin


def lower_lr(lrs) -> str:
    """" (lr=0.1: try 0.01)" for the first group's lr, or ""."""
    lr = lrs[0] if lrs and isinstance(lrs[0], (int, float)) and not isinstance(lrs[0], bool) else None
    return f" (lr={lr:g}: try {lr / 10:g})" if lr else ""
