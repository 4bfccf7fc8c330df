from __future__ import annotations

import ast

from ..analysis.lr import COLLAPSED, schedule_misfit, writer_location
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule, related
from .lr_factor_compounded import LrFactorCompounded
from .schedule_factor_is_lr import ScheduleFactorIsLr
from ..analysis.source import walk

# what to change, by the scheduler that wrote the collapsed lr
_FIXES = {
    "StepLR": "step the scheduler once per epoch (its step_size counts epochs), or size step_size "
              "in optimizer steps (epochs * len(loader))",
    "ExponentialLR": "step the scheduler once per epoch, or take gamma per step "
                     "(gamma ** (1 / len(loader)) for the same decay per epoch)",
    "MultiplicativeLR": "step the scheduler once per epoch, or return a factor per step "
                        "(factor ** (1 / len(loader)))",
    "LambdaLR": "count the lambda's decay in the steps it is called with: "
                "`0.1 ** (step / (decay_epochs * len(loader)))`, or step the scheduler per epoch",
    "LinearLR": "count total_iters in optimizer steps (epochs * len(loader)) when stepped per "
                "batch, or step it once per epoch",
    "PolynomialLR": "count total_iters in optimizer steps (epochs * len(loader)) when stepped per "
                    "batch, or step it once per epoch",
    "MultiStepLR": "give the milestones in the unit the scheduler is stepped in, or step it "
                   "once per epoch",
}
_MANUAL_FIX = ("decay the lr once per epoch, or by a factor sized for one optimizer step "
               "(decay ** (1 / len(loader)))")
_DEFAULT_FIX = "count the schedule's length in the unit you step it in (optimizer steps or epochs)"
# a scheduler Lightning steps itself (automatic optimization, the lr_scheduler config that
# configure_optimizers returns): its "interval" says per batch or per epoch, not a step() call
_LIGHTNING_FIX = ('in configure_optimizers, return the scheduler with "interval": "epoch" '
                  "(Lightning's default: one step per epoch), or keep \"interval\": \"step\" and "
                  "size the schedule in optimizer steps (self.trainer.estimated_stepping_batches)")


def _extra_step(a, writer):
    """``(the step() event of the line stepping most often, the other line's Location)`` when an
    epoch-counted scheduler is stepped from exactly two lines of one file and one of them steps
    it at least twice as often (per batch against per epoch); None otherwise."""
    if writer.cls not in _EPOCH_COUNTED:
        return None
    s = a.schedulers.get(writer.sched)
    if s is None or not s.steps:
        return None
    by_line: dict = {}
    for e in s.steps:
        if e.loc is not None:
            by_line.setdefault((e.loc.path, e.loc.line), []).append(e)
    if len(by_line) != 2 or len({path for path, _ in by_line}) != 1:
        return None
    (often, many), (_, few) = sorted(by_line.items(), key=lambda item: -len(item[1]))
    if len(many) < 2 * len(few):
        return None
    return many[0], few[0].loc


# schedules whose period counts epochs in the usual script: stepped per batch too, they run out
_EPOCH_COUNTED = frozenset({"StepLR", "MultiStepLR", "ExponentialLR", "MultiplicativeLR"})


class LrCollapsed(Rule):
    """
    ## What it does
    Finds a learning rate that falls to almost nothing while training goes on: in a param
    group, the lr of the last step the replay recorded is below 1e-4 of where the group started
    (the optimizer's lr, its scheduler's base lr, or the first step's: a warm-up's climb is no
    fall), and graddoctor stopped the script at its step budget, so it was still stepping. A
    schedule without a floor (`StepLR`, `ExponentialLR`, `MultiplicativeLR`, `LambdaLR`, a
    hand-written decay) that fell steadily by 100× or more in the replay is projected at the
    same rate and reported with the update by which it crosses 1e-4. It points at the
    scheduler's construction (for a `LambdaLR` given a function the script defines, at that
    function's one `return`: the decay is written there), or at the line that writes the lr by
    hand (at the line computing the value when the write copies a name, `g["lr"] = lr`; a
    decay that overtook its warm-up, `base * min(1, (s + 1) / warmup) * 0.5 ** s`, is projected
    from its highest lr when it has fallen 10x from there); when the scheduler is
    stepped from two lines (once per epoch, as its schedule counts, and once more per batch),
    at the line that steps it most often: the extra per-batch `step()`.

    ## Why is this bad?
    A decay meant per epoch applied per batch (`StepLR(step_size=1, gamma=0.1)`,
    `ExponentialLR(gamma=0.5)`, a `LambdaLR` whose exponent counts epochs but is called each
    step, a `LinearLR` to 0 over `total_iters=epochs`) drives the lr to 1e-10 after a few dozen
    updates. The run keeps going for hours, the loss curve flattens, and nothing fails: the
    updates are too small to change anything.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()        # ten times smaller after every batch
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
        scheduler.step()            # once per epoch
    ```

    ## Stays silent on
    A cosine or linear decay that reaches 0 where the script ends; a warm-up from a tiny start
    factor; `ReduceLROnPlateau` dropping the lr, however often; `OneCycleLR`, `CyclicLR` and warm
    restarts; a cosine (it climbs back after its minimum: `scheduler-period-mismatch` judges its
    period); a schedule stepped per micro-batch (`scheduler-per-micro-batch` says it); a decay
    that has fallen less than 100× in the replay; a group the script sets to 0 itself; a run
    that ended on its own (the last steps of a planned decay); a decay to 0 sized in whole
    epochs that ends before the planned run (`schedule-misfits-run` reports it with the run's
    length).
    """

    code = "GD134"
    slug = "lr-collapsed"
    severity = Severity.WARNING
    summary = "the lr applied falls below 1e-4 of its start while the script goes on training"
    fix = _DEFAULT_FIX
    fixes = {"lightning": _LIGHTNING_FIX}

    def check(self, a):
        found = a.lr_collapses
        if not found:
            return
        told = {(f.location.path, f.location.line)
                for rule in (ScheduleFactorIsLr(), LrFactorCompounded())
                for f in rule.check(a) if f.location}
        seen = set()
        for c in found:
            w = c.writer
            loc, step_call = writer_location(a, w, c.opt)
            key = (c.opt, w.sched if w.scheduled else None)
            if key in seen or (loc is not None and (loc.path, loc.line) in told):
                continue  # one finding per writer; schedule-factor-is-lr or lr-factor-compounded says why it collapses
            seen.add(key)
            if w.scheduled and _ends_before_planned_run(a, w.sched):
                continue  # schedule-misfits-run says where the planned run goes past its end
            extra = _extra_step(a, w) if w.scheduled else None
            if extra is not None:
                yield self._extra_finding(a, c, loc, extra)
                continue
            yield self._finding(a, c, loc, step_call)

    def _extra_finding(self, a, c, built, extra):
        w = c.writer
        step, other = extra
        message = (f"this {w.cls}.step() runs at every batch, and the same scheduler is also "
                   f"stepped once per epoch at line {other.line}: the lr of "
                   f"{a.optimizer_name(c.opt)} fell from {c.start:g} to {c.last:.3g} within the "
                   f"{c.updates} updates replayed, a decay sized in epochs applied per batch")
        return self.finding(
            message, step.loc, fix=(f"remove this per-batch step(): the {w.cls} is stepped once "
                                    f"per epoch at line {other.line}, the unit its schedule counts"),
            related=(related(a.schedulers[w.sched].init, "the scheduler, built here"),
                     Related(other, "its once-per-epoch step()")),
            evidence={"optimizer": c.opt, "group": c.group, "start": c.start, "last": c.last,
                      "updates": c.updates, "writer": w.cls, "observed": c.observed,
                      "projected_at": c.at, "extra_step_line": step.loc.line,
                      "epoch_step_line": other.line})

    def _finding(self, a, c, loc, step_call):
        w = c.writer
        name = a.optimizer_name(c.opt)
        groups = len(a.lr_timeline.get(c.opt, {}))
        where = f"param group {c.group} of {name}" if groups > 1 else name
        by = f"its {w.cls}" if w.scheduled else "the script's own lr assignments"
        if c.observed:
            share = f" ({c.last / c.start:.1g} of it)" if c.last else ""
            message = (f"the lr of {where}, set by {by}, fell from {c.start:g} to {c.last:.3g}"
                       f"{share} within the {c.updates} updates replayed, and the script was "
                       f"still stepping when the replay stopped: from there on the updates barely "
                       f"move the weights")
        else:
            message = (f"the lr of {where}, set by {by}, fell steadily from {c.start:g} to "
                       f"{c.last:.3g} ({c.last / c.start:.1g} of it) within the {c.updates} "
                       f"updates replayed; at this rate it is below {COLLAPSED:g} of its start by "
                       f"update {c.at}, while the script goes on training")
        fix = _FIXES.get(w.cls, _DEFAULT_FIX) if w.scheduled else _MANUAL_FIX
        rel = (related(step_call, "its step() call"),)
        factor = _lambda_return(a, loc) if w.scheduled and w.cls == "LambdaLR" and loc is not None else None
        computed = _written_value_line(a, loc) if w.by_hand and loc is not None else None
        if computed is not None:  # `g["lr"] = lr`: the schedule is the line computing `lr`
            rel = (Related(loc, "the lr written into the param group here"), *rel)
            loc = Location(loc.path, computed)
        if factor is not None:  # the decay is the script's function: the line to change
            rel = (Related(loc, "the scheduler, built here"), *rel)
            loc = Location(loc.path, factor)
        # the Lightning variant only where Lightning made the step() calls: a scheduler the user
        # steps by hand (manual optimization) is stepped where the generic fix says
        framework_stepped = step_call is not None and step_call.loc is not None and \
            step_call.loc.hook == "configure_optimizers"
        return self.finding(
            message, loc, fix=fix, fixes=self.fixes if framework_stepped else {},
            related=rel,
            evidence={"optimizer": c.opt, "group": c.group, "start": c.start, "last": c.last,
                      "updates": c.updates, "writer": w.cls if w.scheduled else "manual",
                      "observed": c.observed, "projected_at": c.at},
        )


def _lambda_return(a, built) -> int | None:
    """The line of the one ``return`` of the function the script defines and hands a
    ``LambdaLR`` built at ``built`` as its ``lr_lambda`` (``def lambda_rule(epoch): return
    1.0 - ...``), else None (an inline lambda sits on the construction's line already)."""
    name = a.source.call_argument(built.path, built.line, "LambdaLR", 1, "lr_lambda")
    if not name or not name.isidentifier():
        return None
    tree = a.source.tree(built.path)
    if tree is None:
        return None
    defs = [n for n in walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(defs) != 1:
        return None
    returns = [n for n in walk(defs[0]) if isinstance(n, ast.Return) and n.value is not None]
    return returns[0].lineno if len(returns) == 1 else None


def _written_value_line(a, write) -> int | None:
    """For a hand-written lr write ``group["lr"] = name`` at ``write``, the line of ``name``'s
    last assignment above it in the same function (``lr = base_lr * decay ** step``): the
    schedule is written there. None for a write that computes the lr itself (``group["lr"] *=
    0.5``, ``group["lr"] = base * decay ** step``)."""
    tree = a.source.tree(write.path)
    if tree is None:
        return None
    writes = [n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno == write.line
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript)
              and isinstance(n.value, ast.Name)]
    if len(writes) != 1:
        return None
    name = writes[0].value.id
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= write.line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    inner = {id(d) for f in walk(scope) if f is not scope
             and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for d in walk(f)}
    assigned = [n.lineno for n in walk(scope) if id(n) not in inner and isinstance(n, ast.Assign)
                and n.lineno < write.line
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return max(assigned) if assigned else None


def _ends_before_planned_run(a, sched) -> bool:
    """A decay to 0 sized in whole epochs (of batches, or of the optimizer steps of accumulated
    batches) that ends before the run the script plans: its lr reaching 0 in the replay is that
    misfit, which schedule-misfits-run reports with the planned run's length."""
    s = a.schedulers.get(sched)
    m = schedule_misfit(a, s) if s is not None else None
    return m is not None and m.side == "ends"
