from __future__ import annotations

from ..findings import Severity
from .base import Rule, plural, related


class SchedulerOverridden(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler whose every change of the lr is undone before an optimizer
    step reads it: the script writes the lr into the param groups itself
    (`group["lr"] = base_lr`) on every batch, so each value the scheduler sets is replaced by
    the one it replaced. It judges the changes the run saw: the scheduler changed the lr, the
    next optimizer step read the value from before that change, and no change of it ever
    reached a step. A hand-written warm-up that overrides the scheduler for a while (its values
    differ from the scheduler's and from the previous ones), or an lr derived from the
    scheduler's (`get_last_lr()[0] * scale`), stays silent.

    ## Why is this bad?
    `scheduler.step()` writes the new lr into the optimizer's param groups; a later
    `group["lr"] = ...` overwrites it before `optimizer.step()` reads it. The schedule (decay,
    annealing, plateau reductions) never reaches the optimizer: training runs at the constant
    lr for its whole length, while `scheduler.get_last_lr()` and the logs report the schedule
    as if it were applied.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            for group in optimizer.param_groups:
                group["lr"] = args.lr          # undoes the scheduler every batch
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
    ```
    (or drop the scheduler and write the whole schedule by hand).

    ## Stays silent on
    A hand-written warm-up that overrides the scheduler for the first iterations only; the
    scheduler's value scaled by the script after the scheduler steps; a hand-written
    schedule with no torch scheduler on that optimizer.
    """

    code = "GD224"
    slug = "scheduler-overridden"
    severity = Severity.WARNING
    summary = "the script writes the lr back after every scheduler step: the schedule never reaches the optimizer"
    fix = ("remove the script's own lr assignment, or let it compute the whole schedule and drop "
           "the scheduler")

    def check(self, a):
        for s in a.schedulers.values():
            if s.opt is None or not s.steps:
                continue
            mine = {e.seq for e in s.steps}
            undone, reached = [], 0
            for outcome in _fates(a, s.opt, mine):
                if outcome[0] == "undone":
                    undone.append(outcome)
                else:
                    reached += 1  # used, or replaced by a value that is not the old one
            if reached or not undone:
                continue
            _, before, wrote, step = undone[0]
            writer = _reader_writer(a, s.opt, step)
            where = writer.loc if writer is not None and writer.loc is not None else None
            times = a.count(u[3] for u in undone)  # folded copies included
            manual = f"the assignment at line {where.line}" if where else "the script's own lr assignment"
            yield self.finding(
                f"{s.cls or 'the scheduler'} changes the lr of {a.optimizer_name(s.opt)} (to "
                f"{wrote:g}) and {manual} sets it back to {before:g} before the optimizer "
                f"steps: seen {plural(times, 'time')}, and no change of "
                f"the schedule ever reached a step, so training runs at lr {before:g} while "
                f"get_last_lr() reports the schedule",
                where or s.steps[0].loc,
                related=(related(s.steps[0], "the scheduler step whose change is undone"),
                         related(s.init, "the scheduler")),
                step=a.step_number.get(step.seq),
                evidence={"scheduler": s.cls, "lr_set": float(f"{wrote:.6g}"),
                          "lr_applied": float(f"{before:.6g}"),
                          "undone": times},
            )


def _number(lrs):
    value = lrs[0] if lrs else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fates(a, opt: int, mine: set[int]):
    """What became of each change of group 0's lr by one of the scheduler's steps (seqs
    ``mine``): ("reached",) when the next optimizer step read it, ("undone", before, wrote,
    step) when that step read the value from before the change, ("altered",) otherwise. Steps
    that changed nothing, or that another write followed before any step, are skipped."""
    read = None  # what the optimizer's last step read
    pending = None  # (before, wrote) of a scheduler change no step has read yet
    for e in a.events:
        kind = e.kind
        if kind == "step_begin" and e.get("opt") == opt:
            now = _number(e.get("lrs"))
            if pending is not None and now is not None:
                before, wrote = pending
                step = a.next_step(e.seq)
                if _close(now, wrote):
                    yield ("reached",)
                elif _close(now, before) and step is not None:
                    yield ("undone", before, wrote, step)
                else:
                    yield ("altered",)
            pending, read = None, now
        elif kind in ("scheduler_step", "scheduler_init") and e.get("opt") == opt:
            wrote = _number(e.get("lrs"))
            if e.seq in mine and read is not None and wrote is not None and not _close(read, wrote):
                pending = (read, wrote)
            else:
                pending = None  # another scheduler's write: judged on its own
def _reader_writer(a, opt: int, step):
    """The lr timeline's writer of the value that step read (a manual assignment's line)."""
    number = a.step_number.get(step.seq)
    for point in a.lr_timeline.get(opt, {}).get(0, ()):
        if point.step == number:
            return point.writer
    return None


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-12 + 1e-9 * max(abs(x), abs(y))
