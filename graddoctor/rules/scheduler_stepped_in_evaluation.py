from __future__ import annotations

from ..analysis.lr import CONTAINERS
from ..findings import Role, Severity
from .base import Rule, related

_BURST = 2  # scheduler steps from one line between two optimizer steps, at least


def evaluation_bursts(a, s) -> list[list]:
    """The runs of ``s``'s ``step()`` calls made between two steps of its optimizer, after the
    first, with no backward among them, at least ``_BURST`` from one line, every one under
    ``torch.no_grad()``: each run's events, in order."""
    found, run, stepped, backwards = [], [], False, 0
    for e in a.events:
        kind = e.kind
        if kind == "scheduler_step" and e.get("sched") == s.sched:
            if stepped:
                run.append((backwards, e))
        elif kind == "backward":
            backwards += 1
        elif kind == "step" and e.get("opt") == s.opt:
            chunks: dict[int, list] = {}
            for mark, x in run:
                chunks.setdefault(mark, []).append(x)
            for chunk in chunks.values():
                if len(chunk) >= _BURST and not any(x.get("grad") for x in chunk) and \
                        all(x.loc is not None for x in chunk) and \
                        len({(x.loc.path, x.loc.line) for x in chunk}) == 1:
                    found.append(chunk)
                    break
            run, stepped = [], True
    return found


class SchedulerSteppedInEvaluation(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler stepped inside an evaluation loop: between two steps of
    its optimizer, with no backward between them, the same `scheduler.step()` line ran several
    times under `torch.no_grad()` — once per validation batch. It points at that `step()`.

    ## Why is this bad?
    A per-epoch schedule (`StepLR(step_size=2)`, a cosine over the epochs) counts its own
    `step()` calls. Stepped once per validation batch it advances as many epochs as the
    validation set has batches at every epoch's end: the lr decays (or the cosine reaches its
    minimum and climbs back) long before the run is over. Nothing fails; training goes on at
    a learning rate nobody chose.

    ## Example
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_batches:
            val_loss += loss_fn(model(x), y).item()
            scheduler.step()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_batches:
            val_loss += loss_fn(model(x), y).item()
    scheduler.step()            # once per epoch, after the evaluation
    ```

    ## Stays silent on
    A scheduler stepped once per epoch under `torch.no_grad()` (after the evaluation loop);
    one stepped per batch in the training loop (a backward lies between its steps; micro-batch
    and double stepping are `scheduler-per-micro-batch`'s and `scheduler-stepped-twice`'s);
    steps before the optimizer's first step (a schedule fast-forwarded when resuming);
    `ReduceLROnPlateau` (`plateau-every-batch` looks at it); `SequentialLR`/`ChainedScheduler`
    and the schedulers they hold; steps with gradients on, or from several lines; an evaluation
    after the last optimizer step (the lr it sets is never applied). Not seen: an evaluation loop
    after the check's step budget that the budget does not wait for (see the run notes).
    """

    code = "GD297"
    slug = "scheduler-stepped-in-evaluation"
    severity = Severity.WARNING
    summary = ("a scheduler's step() runs once per batch of an evaluation loop (under no_grad, no "
               "backward between): the schedule advances once per validation batch")
    fix = "call scheduler.step() once per epoch, after the evaluation loop, not inside it"

    def check(self, a):
        for s in a.schedulers.values():
            if not s.positional or s.parent is not None or s.cls in CONTAINERS or s.opt is None:
                continue
            bursts = evaluation_bursts(a, s)
            if not bursts:
                continue
            first = bursts[0]
            name = a.optimizer_name(s.opt)
            before = next((st for st in reversed(a.steps)
                           if st["opt"] == s.opt and st.seq < first[0].seq), None)
            after = next((st for st in a.steps if st["opt"] == s.opt and st.seq > first[-1].seq), None)
            lrs = first[-1].get("lrs") or []
            lr = f"; the lr is {lrs[0]:.3g} after them" if lrs and isinstance(lrs[0], float) else ""
            yield self.finding(
                f"{s.cls}.step() ran {len(first)} times in a row under torch.no_grad() between two "
                f"steps of {name}, with no backward between them: it is stepped once per batch of an "
                f"evaluation loop, so the schedule advances {len(first)} of its steps at every "
                f"evaluation{lr}",
                first[0].loc,
                related=(related(before, "the optimizer step before the evaluation", Role.STEP),
                         related(after, "the next optimizer step, at the lr it left", Role.STEP),
                         related(s.init, f"{s.cls} built here")),
                evidence={"scheduler": s.cls, "optimizer": s.opt, "burst": len(first),
                          "evaluations": len(bursts)},
            )
