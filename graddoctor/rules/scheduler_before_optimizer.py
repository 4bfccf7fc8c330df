from __future__ import annotations

from ..analysis.lr import NOT_POSITIONAL, per_micro_batch
from ..findings import Role, Safety, Severity
from .base import Rule, related
from .source import move_after, related_line


class SchedulerBeforeOptimizer(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler whose `step()` runs before the optimizer it drives has made
    its first step: `scheduler.step()` at the top of the epoch or of the iteration instead of
    after `optimizer.step()`. A step that `GradScaler` skipped because of inf/NaN gradients
    counts as the optimizer's step here (PyTorch's own warning is wrong in that case: it fires
    for correct AMP loops whose first steps are skipped).

    ## Why is this bad?
    Since PyTorch 1.1 a scheduler's `step()` moves to the *next* learning rate. Called first, it
    skips the first value of the schedule: warm-up starts one step late, `OneCycleLR` and cosine
    schedules are shifted, and a per-iteration scheduler may raise at the very end because it
    runs one step past `total_steps`.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler.step()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        scheduler.step()
    ```

    ## Stays silent on
    Steps a GradScaler skipped (PyTorch's own warning is wrong there); a fresh scheduler
    stepped several times before training to resume where a checkpoint left off
    (`for _ in range(start_epoch): scheduler.step()`); schedulers stepped
    after every optimizer step, at the accumulation boundary, per micro-batch when sized so,
    or per epoch; a hand-written warm-up; the frameworks' schedulers (Lightning,
    accelerate).
    """

    code = "GD206"
    slug = "scheduler-before-optimizer"
    severity = Severity.WARNING
    summary = "lr_scheduler.step() runs before the optimizer it drives has stepped"
    fix = "call scheduler.step() after optimizer.step() (or scaler.step(optimizer))"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Move the scheduler's step after the statement of its block that holds the optimizer's
        first step (the step itself, or the batch loop that steps)."""
        sched = src.statement_at(finding.location.line)
        step_line = related_line(finding, Role.FIRST_STEP)
        if sched is None or step_line is None or step_line <= sched.end_line:
            return None
        after = next((t for t in src.siblings(sched) if t.line > sched.end_line
                      and t.contains(step_line)), None)
        if after is None:
            return None
        moved = move_after(src, sched, after, indent=src.indent(sched))
        return self.edit("step the scheduler after the optimizer", *moved) if moved else None

    def check(self, a):
        stepped: dict[int, object] = {}  # opt -> its first step (GradScaler-skipped ones count)
        seen: set[int] = set()
        early = []
        before: dict[int, int] = {}  # sched -> its steps before its optimizer's first
        for e in a.events:
            if e.kind == "step":
                stepped.setdefault(e["opt"], e)
            elif e.kind == "scheduler_step":
                opt = e.get("opt")
                if opt is not None and opt not in stepped:
                    before[e["sched"]] = before.get(e["sched"], 0) + 1
                if e["sched"] in seen:
                    continue
                seen.add(e["sched"])
                if opt is not None and opt not in stepped and e.get("cls") not in NOT_POSITIONAL:
                    early.append(e)
        for e in early:
            first = stepped.get(e["opt"])
            if first is None:
                continue  # the optimizer never steps in the replay: nothing to compare with
            if before.get(e["sched"], 0) > 1:
                # stepped again and again before any update: a resumed run fast-forwarding a
                # fresh scheduler to its epoch (`for _ in range(start_epoch): scheduler.step()`);
                # a scheduler stepped too early steps once per update or epoch, one step ahead
                continue
            schedule = a.schedulers.get(e["sched"])
            if schedule is not None and per_micro_batch(a, schedule) is not None:
                continue  # stepped every micro-batch: scheduler-per-micro-batch names the cause
            yield self.finding(
                f"{e.get('cls', 'the scheduler')}.step() runs before {a.optimizer_name(e['opt'])} "
                f"has made its first step: the schedule's first learning rate is skipped and every "
                f"later one comes one step early",
                e.loc,
                related=(related(first, "the optimizer's first step comes only here", Role.FIRST_STEP),),
                evidence={"scheduler": e.get("cls"), "optimizer": e["opt"]},
            )
