from __future__ import annotations

import math
from dataclasses import replace

from ..findings import Severity
from ..analysis.lr import factor_line, planned_run, schedule_misfit
from .base import Rule, related

MIN_POINTS = 3  # recorded lrs of a LambdaLR whose linear rise is extrapolated
LINEAR = 1e-3  # relative spread of the rise per step that still makes a straight ramp


class WarmupNeverEnds(Rule):
    """
    ## What it does
    Finds a learning-rate warm-up that is still ramping at the last step the script plans to
    take: the warm-up's length, in the steps its scheduler is stepped in, is at least the run's.
    The warm-up's length comes from the scheduler (`LinearLR`'s `total_iters` with
    `start_factor` below `end_factor`, transformers' `num_warmup_steps`, `OneCycleLR`'s rise
    (`pct_start × total_steps`), a `SequentialLR`'s first
    milestone after a warm-up, or the straight rise of a `LambdaLR` such as
    `min(1, step / warmup)` extrapolated to its peak, counted in the scheduler's own steps: per
    batch, per epoch, or per Lightning `"interval": "epoch"`); the run's length from the loop
    around the script's DataLoader loop (`for epoch in range(epochs)` times the loader's real
    length for a scheduler stepped per batch, `epochs` for one stepped per epoch, `while step <
    max_steps`), from a loop without a DataLoader (`for epoch in range(epochs): for i in
    range(0, n, bs)`: the updates of its first pass, which the replay runs to its end), from
    Lightning's `max_epochs` and the Trainer's `num_train_epochs`, or transformers' own
    `num_training_steps`.

    ## Why is this bad?
    The warm-up was meant as the first few percent of training. Sized in the wrong unit
    (`epochs * len(loader)` steps per epoch, a batch count used as an epoch count) or from the
    wrong total, it spans the whole run: the model trains at a fraction of its learning rate
    and never at the peak, and with a linear decay after it (transformers' schedules) the decay
    never starts. Nothing fails; the run is just much worse.

    ## Example
    ```python
    total_steps = epochs * len(loader)
    warmup_steps = int(0.1 * total_steps) * len(loader)   # a batch count times len(loader) again
    scheduler = LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup_steps))
    for epoch in range(epochs):
        for x, y in loader:
            ...
            scheduler.step()
    ```

    ## Use instead
    ```python
    warmup_steps = int(0.1 * total_steps)
    ```

    ## Stays silent on
    A warm-up that ends within the planned run (however long); a run whose length graddoctor
    cannot read (a loop over something else than `range`, a count it cannot evaluate without
    running the script's code); a schedule stepped per micro-batch (`scheduler-per-micro-batch`)
    or twice per step; a `LambdaLR` whose rise is not a straight line (an exponential warm-up,
    a cycle) or that already held, or whose lambda's text is no straight line in its step when
    the replay saw two of its values only (a warm-up stepped per epoch); a schedule sized in
    batches as a whole and stepped per epoch or per accumulated update (`schedule-misfits-run`
    says it); a total sized from `len(loader)` that the replay shortened
    (`--epoch-batches`) and that is longer than the warm-up at the loader's real length.
    """

    code = "GD139"
    slug = "warmup-never-ends"
    severity = Severity.WARNING
    summary = ("a learning-rate warm-up lasts as long as the planned run or longer: the lr is "
               "still ramping at the last step")
    fix = ("size the warm-up as a part of the run in the unit the scheduler is stepped in "
           "(`warmup_steps = int(0.05 * epochs * len(loader))` for a scheduler stepped per batch)")

    def check(self, a):
        lines: dict = {}
        for s in a.schedulers.values():
            if s.init is not None and s.init.loc is not None:
                key = (s.init.loc.path, s.init.loc.line)
                lines[key] = lines.get(key, 0) + 1
        for s in a.schedulers.values():
            if s.parent is not None or s.init is None or s.init.loc is None or s.opt is None:
                continue  # a SequentialLR's child is judged through it
            if lines[(s.init.loc.path, s.init.loc.line)] > 1:
                continue  # rebuilt in the loop: each lives a part of the run (scheduler-recreated)
            found = _warmup(a, s)
            if found is None:
                continue
            length, how, child = found
            total = s.args.get("num_training_steps")
            stretch = _shortened_by_replay(a, s)
            if isinstance(total, int) and 0 < total <= length and total * stretch > length:
                continue  # sized from the replay's shortened len(loader): the real plan is longer
            if isinstance(total, int) and 0 < total <= length:
                yield self._finding(a, s, length, total, how,
                                    f"the schedule's own num_training_steps is {total:,}")
                continue
            plan = _planned(a, s)
            if plan is None:
                continue
            misfit = schedule_misfit(a, s)
            if misfit is not None and misfit.side in ("micro", "still"):
                continue  # the whole schedule is sized in batches: schedule-misfits-run says it
            steps, described, unit = plan
            if length >= steps and steps * stretch > length:
                continue
            if length >= steps:
                yield self._finding(a, s, length, steps, how, described, unit)

    def _finding(self, a, s, length, total, how, described, unit=None):
        reached = min(1.0, total / length)
        loc, fix, given = s.init.loc, None, None
        if unit == "epoch":  # a warm-up of more steps than the run has epochs: counted in batches
            by_lightning = bool(s.steps) and s.steps[0].loc is not None \
                and s.steps[0].loc.hook == "configure_optimizers"
            fix = ('return the scheduler with "interval": "step" in the lr_scheduler config of '
                   "configure_optimizers (Lightning then steps it after every optimizer step), or "
                   "size the warm-up in epochs" if by_lightning else
                   "step the scheduler after every optimizer.step() (inside the batch loop), or "
                   "size the warm-up in epochs, the unit it is stepped in")
        if loc.via == "transformers" and how == "num_warmup_steps":
            # the Trainer built its own schedule from TrainingArguments: the warm-up to change
            # is the argument the script gave it, not the trainer.train() line
            given = a.source.keyword_argument(loc.path, "TrainingArguments",
                                              ("warmup_steps", "warmup_ratio"))
            if given is not None:
                loc = replace(loc, line=given[0], via="", hook="")
                fix = (f"in TrainingArguments, make the warm-up a small part of the run: "
                       f"warmup_steps=int(0.1 * max_steps) or warmup_ratio=0.1, not `{given[1]}`")
        return self.finding(
            f"this {s.cls}'s warm-up lasts {length:,} steps ({how}"
            + (f", from TrainingArguments' `{given[1]}`" if given is not None else "")
            + f"), but {described}: at the "
            f"run's last step the lr is still ramping, {reached:.0%} of the way through its "
            f"warm-up, and the model never trains at the lr it was given",
            loc, step=1, fix=fix,
            related=tuple(r for r in (related(s.steps[0], "its step(), which counts the warm-up")
                                      if s.steps else None,) if r is not None),
            evidence={"scheduler": s.cls, "warmup": length, "planned": total, "how": how,
                      "planned_from": described})


def _shortened_by_replay(a, s) -> float:
    """How much longer than planned the schedule would be outside the replay: the replay makes a
    DataLoader's epochs (and its ``len()``) at most --epoch-batches long, so a total computed
    from ``len(loader)`` before the scheduler was built (``num_training_steps=len(loader) *
    epochs``) is that much shorter than the script's real plan. 1.0 when no shortened length
    was read before it."""
    seq = s.init.seq
    ratios = [e["real_len"] / e["replay_len"] for e in a.of_kind("short_len")
              if e.seq < seq and e.get("replay_len") and e.get("real_len")]
    return max(ratios, default=1.0)


def _warmup(a, s) -> tuple[int, str, object] | None:
    """``(length, how it was read, the warm-up schedule)`` in the scheduler's own steps, or None
    when it has no warm-up graddoctor can read."""
    args = s.args
    if s.cls == "LambdaLR" and isinstance(args.get("num_warmup_steps"), int):
        n = args["num_warmup_steps"]
        return (n, "num_warmup_steps", s) if n > 0 else None
    if s.cls == "LinearLR":
        start, end = args.get("start_factor", 1 / 3), args.get("end_factor", 1.0)
        n = args.get("total_iters", 5)
        if isinstance(start, (int, float)) and isinstance(end, (int, float)) and start < end \
                and isinstance(n, int) and n > 0:
            return n, "LinearLR's total_iters", s
        return None
    if s.cls == "OneCycleLR":
        n = args.get("rise_steps")
        return (n, "OneCycleLR's rise, pct_start × total_steps", s) if isinstance(n, int) and n > 0 \
            else None
    if s.cls == "SequentialLR":
        milestones = args.get("milestones") or []
        children = (s.init.get("children") or []) if s.init is not None else []
        first = a.schedulers.get(children[0]) if children else None
        if not milestones or not isinstance(milestones[0], int) or first is None:
            return None
        inner = _warmup(a, first) if first.cls in ("LinearLR",) or \
            "num_warmup_steps" in first.args else None
        if inner is None:
            return None
        return min(inner[0], milestones[0]), "its warm-up up to the first milestone", first
    if s.cls == "LambdaLR":
        return _lambda_ramp(a, s)
    return None


def _lambda_ramp(a, s) -> tuple[int, str, object] | None:
    """A LambdaLR's factor rising in a straight line at every recorded step and still below 1 at
    the last: the step at which it reaches 1 (``min(1, step / warmup)``)."""
    base = (s.init.get("base_lrs") or [None])[0]
    if not isinstance(base, (int, float)) or base <= 0:
        return None
    points = [(p.step, p.lr / base) for p in a.lr_timeline.get(s.opt, {}).get(0, ())
              if p.writer.sched == s.sched and p.step is not None and isinstance(p.lr, (int, float))]
    found = _straight_ramp(points) if len(points) >= MIN_POINTS else None
    if found is None:
        # stepped once per epoch (a staircase over the optimizer's steps): its own steps
        line = factor_line(a, s)
        if line is None or not (0 <= line[0] < line[3] < 1) or \
                not a.source.factor_capped(s.init.loc.path, s.init.loc.line, "LambdaLR"):
            return None
        _f0, slope, n1, f1 = line
        found = math.ceil(n1 + (1 - f1) / slope - 1e-9)
    return found, "its lr_lambda's straight rise, extrapolated to 1", s


def _straight_ramp(points) -> int | None:
    (n0, f0), (n1, f1) = points[0], points[-1]
    if not 0 <= f0 < f1 < 1 or n1 <= n0:
        return None
    slope = (f1 - f0) / (n1 - n0)
    for n, f in points[1:-1]:
        if abs(f - (f0 + slope * (n - n0))) > LINEAR * f1:
            return None  # not a straight ramp
    return math.ceil(n1 + (1 - f1) / slope)


def _planned(a, s) -> tuple[int, str, str] | None:
    """``(the run's length in the scheduler's steps, how it was read)`` or None: the plan every
    schedule is judged against (analysis/lr.py's ``planned_run``)."""
    plan = planned_run(a, s)
    if plan is None:
        return None
    if plan.unit == "epoch":
        return (plan.steps, f"the run plans {plan.steps:,} epochs (the scheduler steps once per "
                f"epoch)", plan.unit)
    if plan.epochs is None:
        return plan.steps, f"the run's loop plans {plan.steps:,} steps", plan.unit
    return plan.steps, f"the run plans {plan.steps:,} steps ({plan.described})", plan.unit
