from __future__ import annotations

import ast

from ..analysis.lr import per_micro_batch
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk


class SchedulerPerMicroBatch(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler stepped after every micro-batch of a gradient-accumulation
    window: k `scheduler.step()` calls for each `optimizer.step()`. Stays silent when the
    schedule's length counts micro-batches (a whole number of the DataLoader's batches, such as
    `OneCycleLR(total_steps=epochs * len(loader))`): it then still ends with training. Also
    found when the per-batch stepping starts only after the first update. Under accelerate, a
    raw scheduler stepped inside `with accelerator.accumulate(...)` (where the examples step the
    prepared one) is reported at the `accelerator.prepare(...)` call that leaves it out.

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
    accumulation; per-epoch and chained schedules; a raw scheduler under accelerate stepped only
    `if accelerator.sync_gradients:`.
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
            where = s.steps[0].loc
            rel = (related(first_step, "the optimizer step it should follow, once per update"),
                   related(s.init, f"{s.cls} built here"))
            prepare = _prepare_without(a, s) if a.framework == "accelerate" else None
            if prepare is not None:  # stepped where accelerate's examples step it: the missing
                # piece is the scheduler in accelerator.prepare(), which the fix names
                where, rel = prepare, (Related(where, "its step() inside accelerator.accumulate()"), *rel)
            yield self.finding(
                f"{s.cls}.step() runs after every micro-batch, about {kk} times per step of "
                f"{name} (gradient accumulation): {tail}",
                where, related=rel,
                evidence={"scheduler": s.cls, "optimizer": s.opt, "per_update": round(k, 3),
                          "length": found.length},
            )


def _prepare_without(a, s):
    """The ``accelerator.prepare(...)`` line that leaves this scheduler out, when its ``step()``
    sits inside a ``with accelerator.accumulate(...)`` block (the place accelerate's examples
    step a prepared scheduler): the one prepare call of the file that names the optimizer but
    not the scheduler's variable. None otherwise (a step outside the block is itself misplaced)."""
    loc, built = s.steps[0].loc, s.init.loc if s.init is not None else None
    tree = a.source.tree(loc.path) if loc is not None and built is not None else None
    if tree is None or built.path != loc.path:
        return None
    inside = any(isinstance(n, ast.With) and n.lineno < loc.line <= (n.end_lineno or n.lineno)
                 and any(isinstance(i.context_expr, ast.Call)
                         and isinstance(i.context_expr.func, ast.Attribute)
                         and i.context_expr.func.attr == "accumulate" for i in n.items)
                 for n in walk(tree))
    if not inside:
        return None
    name = next((t.id for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno == built.line
                 for t in n.targets if isinstance(t, ast.Name)), None)
    prepares = [n for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "prepare"]
    if name is None or len(prepares) != 1:
        return None
    args = {x.id for x in prepares[0].args if isinstance(x, ast.Name)}
    if name in args or len(args) < 2:
        return None
    return Location(loc.path, prepares[0].lineno)
