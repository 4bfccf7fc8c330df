from __future__ import annotations

import ast

from ..findings import Severity
from .base import Rule, related
from ..analysis.source import walk

_ZERO = 0.01  # of the schedule's highest lr: where a decay ends
_BACK = 0.5  # of the highest lr: climbed back to
_RISING = 2  # steps of the climb that are neither the start nor the top: a rise, not a restart
_CYCLIC = ("%", "cycle", "restart", "period", "triangular", "sawtooth")  # the lambda cycles on purpose


def _first_lr(step):
    lrs = step.get("lrs") or ()
    return lrs[0] if lrs and isinstance(lrs[0], (int, float)) else None


def _rises_after_zero(lrs: list[float], gaps: list[bool] | None = None) -> tuple[int, int] | None:
    """``(bottom, top)`` indices when the lr reaches ``_ZERO`` of its highest value after that
    value, then climbs back above ``_BACK`` of it through ``_RISING`` steps or more in between
    (a cosine past its end), else None. A jump from the bottom to the top in a step or two is a
    restart, not this; ``gaps[j]``: steps folded out of the trace between ``j - 1`` and ``j``
    (a long run's), so that a climb read across them counts as gradual."""
    if len(lrs) < 4:
        return None
    peak = max(lrs)
    if not peak > 0:
        return None
    top = lrs.index(peak)
    for i in range(top + 1, len(lrs)):
        if lrs[i] > _ZERO * peak:
            continue
        climb = 0
        for j in range(i + 1, len(lrs)):
            if lrs[j] < lrs[j - 1]:
                break
            if gaps is not None and gaps[j]:
                climb = _RISING
            if lrs[j] >= _BACK * peak:
                return (i, j) if climb >= _RISING else None
            if lrs[j] > lrs[j - 1]:
                climb += 1
        return None
    return None


def _schedule_text(a, loc) -> str:
    """The whole statement at ``loc`` (a constructor spread over lines) and the text of each
    function of the file it names (the lr_lambda written as a ``def``), or the line alone."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return a.source.line_text(loc.path, loc.line)
    compound = (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef, ast.ClassDef, ast.Try)
    statement = next((node for node in walk(tree) if isinstance(node, ast.stmt)
                      and not isinstance(node, compound)
                      and node.lineno <= loc.line <= (node.end_lineno or node.lineno)), None)
    if statement is None:
        return a.source.line_text(loc.path, loc.line)
    names = {n.id for n in walk(statement) if isinstance(n, ast.Name)}
    defs = [ast.unparse(node) for node in walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name in names]
    return "\n".join([ast.unparse(statement), *defs])


class ScheduleRisesAfterZero(Rule):
    """
    ## What it does
    Reads the learning rates a hand-written `LambdaLR` (or `MultiplicativeLR`) gave its
    optimizer at each `scheduler.step()` of the run. It reports a schedule that decays to about
    zero (1 % of its highest lr) and then climbs back, step by step, above half of it: a cosine
    (or any formula) whose progress passes 1 before the run ends because its length is too
    short. It points at the scheduler's construction.

    ## Why is this bad?
    `0.5 * (1 + cos(pi * progress))` is a decay only while `progress` stays within [0, 1]; past
    the length it was given (one epoch instead of all of them, a step count in the wrong unit)
    the cosine turns and the lr rises again to its peak, then falls, then rises: training
    anneals and re-heats every few hundred steps, and the end of the run is at whatever phase
    the cycle happens to be in. Nothing fails; the loss curve shows a ripple.

    ## Example
    ```python
    total = len(train_loader)  # one epoch; the loop runs epochs * len(train_loader) steps
    scheduler = LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    ```

    ## Use instead
    ```python
    total = epochs * len(train_loader)
    scheduler = LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    ```

    ## Stays silent on
    Schedules that cycle on purpose: `CyclicLR`, `CosineAnnealingWarmRestarts`, `OneCycleLR`
    and other classes than `LambdaLR` / `MultiplicativeLR`, a lambda whose text cycles (`%`,
    or a name with cycle, restart, period); a restart that jumps back to the top in a step or
    two; a decay that stays at zero; a warm-up (the rise before the highest lr).
    """

    code = "GD407"
    slug = "schedule-rises-after-zero"
    severity = Severity.WARNING
    summary = ("a hand-written LambdaLR decays to zero and then climbs back: its progress passes "
               "1 before the run ends (a cosine sized too short)")
    fix = ("size the schedule over the whole run (epochs * len(loader) optimizer steps) and clamp "
           "its progress: min(step, total) / total")

    def check(self, a):
        for s in a.schedulers.values():
            if s.cls not in ("LambdaLR", "MultiplicativeLR") or s.init is None \
                    or s.init.loc is None or s.parent is not None:
                continue
            steps = [st for st in s.steps if _first_lr(st) is not None]
            lrs = [_first_lr(st) for st in steps]
            gaps = [False] + [a.weight(before) > 1 for before in steps[:-1]]
            found = _rises_after_zero(lrs, gaps)
            if found is None:
                continue
            text = _schedule_text(a, s.init.loc)
            name = str(s.init.get("args", {}).get("lr_lambda", ""))
            if any(word in (text + name).lower() for word in _CYCLIC):
                continue
            bottom, back = found
            peak = max(lrs)
            yield self.finding(
                f"this {s.cls}'s lr decays to about zero (from {peak:.3g}) and then climbs "
                f"back above half of its peak, step by step, while the run goes on: the schedule's "
                f"progress passes its end before the run does, so a decay turns into a cycle (a "
                f"cosine past pi rises again) and training re-heats",
                s.init.loc,
                related=(related(steps[bottom], "the lr reaches zero here"),
                         related(steps[back], "and is back near its peak here")),
                evidence={"scheduler": s.cls, "peak": peak})
