from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

# torch's schedulers whose step() takes no metric: an argument is the deprecated ``epoch``
# (ReduceLROnPlateau takes the metric; CosineAnnealingWarmRestarts a fractional epoch)
EPOCH_ONLY = frozenset({"StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR",
                        "MultiplicativeLR", "ConstantLR", "LinearLR", "PolynomialLR", "CyclicLR",
                        "OneCycleLR", "SequentialLR", "ChainedScheduler"})
METRICS = {"number": "a number that is no epoch index", "tensor": "a tensor",
           "grad_tensor": "a tensor that requires grad (a loss)"}


class SchedulerGivenMetric(Rule):
    """
    ## What it does
    Finds `scheduler.step(value)` on one of torch's schedulers that take no metric (StepLR,
    CosineAnnealingLR, OneCycleLR, ...) given a loss or another metric: a tensor, or a number
    that is no epoch index. Typically left over from `ReduceLROnPlateau`, whose `step` takes
    the validation loss. It points at that call.

    ## Why is this bad?
    Those schedulers read the argument as the deprecated `epoch`: instead of advancing one step,
    the schedule jumps to the epoch the loss names. A StepLR with `step_size=30` fed a loss of
    0.7 stays at epoch 0 and never decays; a cosine schedule follows the loss up and down. The
    learning rate no longer follows the number of steps, and nothing fails.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)
    ...
    scheduler.step(val_loss)
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)
    ...
    scheduler.step()
    ```

    ## Stays silent on
    `ReduceLROnPlateau.step(val_loss)`; `scheduler.step(epoch)` with an integer epoch (deprecated,
    but it means what it says); `CosineAnnealingWarmRestarts.step(epoch + i / iters)`, which
    takes a fractional epoch; a scheduler class of the script's own.
    """

    code = "GD239"
    slug = "scheduler-given-metric"
    severity = Severity.WARNING
    summary = ("a scheduler that takes no metric is given one: step(loss) reads it as the epoch, "
               "and the schedule jumps around")
    fix = ("call scheduler.step() without an argument; for a schedule that follows the metric, "
           "use ReduceLROnPlateau")

    def check(self, a):
        groups: dict = {}
        for e in a.by_kind.get("scheduler_step", ()):
            if e.get("cls") in EPOCH_ONLY and e.get("metric") in METRICS:
                groups.setdefault(e.loc, []).append(e)
        for loc, calls in groups.items():
            first = calls[0]
            cls = first["cls"]
            times = a.count(calls)
            yield self.finding(
                f"{cls}.step() takes no metric, yet it gets {METRICS[first['metric']]} here"
                f"{f' ({times} calls)' if times > 1 else ''}: {cls} reads it as the deprecated "
                f"epoch argument and jumps to the epoch that value names, so the learning rate "
                f"follows the metric instead of the steps",
                loc, related=(related(a.event(_init(a, first)), f"the {cls} built here"),),
                evidence={"scheduler": cls, "metric": first["metric"], "calls": times},
                fix=(f"call the scheduler's step() without an argument; if the learning rate should "
                     f"follow this metric, build a ReduceLROnPlateau instead of the {cls}"))


def _init(a, step) -> int | None:
    """The seq of the scheduler's construction, if recorded."""
    for e in a.by_kind.get("scheduler_init", ()):
        if e.get("sched") == step.get("sched"):
            return e.seq
    return None
