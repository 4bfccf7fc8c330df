from __future__ import annotations

from ..analysis.lr import stepped_twice
from ..findings import Role, Severity
from .base import Rule, related


class SchedulerSteppedTwice(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler whose `step()` runs twice (or more) for every step of its
    optimizer, without gradient accumulation to explain it: at least two scheduler steps
    between two optimizer steps, about k ≥ 2 per update over the run, and more scheduler steps
    than backward calls. It points at the second `step()` line when two lines step it, else at
    the one line.

    ## Why is this bad?
    Every schedule counts its own `step()` calls: stepped twice per update it runs twice as
    fast. A cosine sized for the whole run reaches its minimum halfway and climbs back (or a
    `OneCycleLR` raises after half the run), a warm-up is half as long, `StepLR` decays come
    twice as early. Nothing fails; the run trains with a schedule nobody chose.

    ## Example
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        scheduler.step()        # left from an edit: a second step per update
    ```

    ## Use instead
    ```python
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()        # once per optimizer step
    ```

    ## Stays silent on
    A scheduler stepped once per micro-batch under accumulation (`scheduler-per-micro-batch`);
    two schedulers chained on one optimizer, each stepped once (a warm-up and a decay);
    `SequentialLR`/`ChainedScheduler` and the schedulers they hold; `ReduceLROnPlateau`; a
    scheduler stepped per batch and once more at each epoch's end.
    """

    code = "GD136"
    slug = "scheduler-stepped-twice"
    severity = Severity.WARNING
    summary = "a scheduler's step() runs twice per optimizer step: the schedule runs twice as fast"
    fix = "call scheduler.step() once per optimizer.step(): remove the extra call"

    def check(self, a):
        for s in a.schedulers.values():
            found = stepped_twice(a, s)
            if found is None or not s.steps:
                continue
            k = int(round(found.k))
            name = a.optimizer_name(s.opt)
            lines = found.lines
            where = lines[-1] if len(lines) > 1 else s.steps[0]
            if len(lines) > 1:
                calls = f"from {len(lines)} lines"
            else:
                calls = "from this one line"
            if found.length is not None:
                tail = f"its length is used up after 1/{k} of the updates it was sized for"
            else:
                tail = f"every warm-up and decay comes {k}× too early"
            first_step = next((st for st in a.steps if st["opt"] == s.opt), None)
            yield self.finding(
                f"{s.cls}.step() runs {k} times per step of {name} ({calls}), more often than "
                f"backward calls run, so no gradient accumulation explains it: the schedule "
                f"advances {k}× faster than training; {tail}",
                where.loc,
                related=(*(related(e, "another step() of the same scheduler") for e in lines[:-1]),
                         related(first_step, "the optimizer step it should follow, once", Role.STEP),
                         related(s.init, f"{s.cls} built here")),
                evidence={"scheduler": s.cls, "optimizer": s.opt, "per_update": round(found.k, 3),
                          "length": found.length, "lines": len(lines)},
            )
