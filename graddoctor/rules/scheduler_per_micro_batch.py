from __future__ import annotations

from ..analysis.lr import per_micro_batch
from ..findings import Severity
from .base import Rule, related


class SchedulerPerMicroBatch(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler stepped after every micro-batch of a gradient-accumulation
    window: k `scheduler.step()` calls for each `optimizer.step()`. Stays silent when the
    schedule's length counts micro-batches (a whole number of the DataLoader's batches, such as
    `OneCycleLR(total_steps=epochs * len(loader))`): it then still ends with training. Also
    found when the per-batch stepping starts only after the first update.

    ## Why is this bad?
    The schedule advances k times per update. A warm-up sized in updates ends after 1/k of its
    updates, a decay reaches its end k times too early (transformers' linear schedule then keeps
    the lr at 0 for the rest of training; `OneCycleLR` raises once it runs past `total_steps`).
    Only the lr at each optimizer step matters, so the k-1 values in between are lost.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()             # every micro-batch
    ```

    ## Use instead
    ```python
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()         # once per update
    ```

    ## Stays silent on
    Schedulers stepped once per update at the accumulation boundary; `OneCycleLR` sized in
    micro-batches and stepped after each; transformers' schedules per update under
    accumulation; per-epoch and chained schedules.
    """

    code = "GD222"
    slug = "scheduler-per-micro-batch"
    severity = Severity.WARNING
    summary = "a scheduler is stepped every micro-batch under gradient accumulation: k schedule steps per update"
    fix = "call scheduler.step() once per optimizer.step(), inside the accumulation boundary"
    fixes = {
        "accelerate": ("pass the scheduler to accelerator.prepare() with the optimizer "
                       "(`model, optimizer, loader, scheduler = accelerator.prepare(...)`) and "
                       "step the object it returns: it advances only when the gradients sync"),
    }

    def check(self, a):
        for s in a.schedulers.values():
            found = per_micro_batch(a, s)
            if found is None or not s.steps:
                continue
            k = found.k
            kk = str(int(round(k)))
            name = a.optimizer_name(s.opt)
            if found.length is not None and found.sized_in_updates:
                tail = (f"its length ({found.length}) counts {name}'s updates, so the schedule "
                        f"runs out after about 1/{kk} of them")
            elif found.length is not None:
                tail = (f"its length ({found.length} steps) is used up {kk} times faster than "
                        f"{name} updates")
            else:
                tail = f"warm-up and decay run {kk} times faster than {name} updates"
            first_step = next((st for st in a.steps if st["opt"] == s.opt), None)
            yield self.finding(
                f"{s.cls}.step() runs after every micro-batch, about {kk} times per step of "
                f"{name} (gradient accumulation): {tail}",
                s.steps[0].loc,
                related=(related(first_step, "the optimizer step it should follow, once per update"),
                         related(s.init, f"{s.cls} built here")),
                evidence={"scheduler": s.cls, "optimizer": s.opt, "per_update": round(k, 3),
                          "length": found.length},
            )
