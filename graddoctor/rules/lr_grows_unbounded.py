from __future__ import annotations

from ..analysis.lr import writer_location
from ..findings import Severity
from ..trace import Location
from .base import Related, Rule, related

_FIXES = {
    "ExponentialLR": "give ExponentialLR a gamma below 1 (0.9, 0.99): above 1 it multiplies the lr "
                     "at every step without end",
    "StepLR": "give StepLR a gamma below 1: above 1 every step_size multiplies the lr again",
    "MultiplicativeLR": "return a factor below 1 from lr_lambda (or 1.0 once a warm-up is done)",
    "LambdaLR": "cap the factor the lambda returns: a warm-up is `min(1.0, (step + 1) / warmup)`, "
                "then a decay",
}
_MANUAL_FIX = "cap the lr the script writes (a warm-up ends at the target lr, then holds or decays)"


class LrGrowsUnbounded(Rule):
    """
    ## What it does
    Finds a learning rate that keeps rising past every lr the script set: in a param group, the
    lr of the last step the replay recorded is 10× (warning) or 2× (`info`) above the largest of
    the optimizer's lr, its schedulers' base lrs and the first step's lr, it rose at every
    recorded step (never held nor fell), the schedule has no ceiling (`ExponentialLR`, `StepLR` and
    `MultiplicativeLR` with a factor above 1, a `LambdaLR`, the script's own `group["lr"]`
    writes), and graddoctor stopped the script at its step budget while it was still stepping.
    It points at the scheduler's construction or at the line that writes the lr by hand.
    The same, as a warning, for an lr that fell after the first step (and held or fell on), then
    rose at every step to 2× the largest lr the script set and was still rising when the replay
    stopped: a decay that turns into a climb past its start is a schedule whose pieces run
    in the wrong order (`if step > warmup:` where `<` was meant sends the steps after the
    warm-up into the warm-up's `(step + 1) / warmup`). Whatever the lambda's text caps, the lr
    the run recorded did not stop; it points at the comparison in the lambda's `def` that picks
    the branch, when there is one.

    ## Why is this bad?
    `ExponentialLR(gamma=1.1)` (meant 0.9?), a `LambdaLR` warm-up without its `min(1, ...)`
    (`lambda s: (s + 1) / warmup` keeps rising after the warm-up), or a factor that multiplies
    the lr every step make the lr grow without end: a few hundred steps later it is 1e4× the
    value you chose, the loss spikes and becomes NaN, long after the line that caused it.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup_steps)
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps))
    ```

    ## Stays silent on
    A warm-up to the optimizer's lr, then a decay; `OneCycleLR` and `CyclicLR` (they set the lr
    from `max_lr`); `LinearLR` (its `end_factor` caps it); a warm-up to a scaled peak (the linear
    scaling rule's `world_size * min(1, step / warmup)`: it holds once there); a `StepLR` whose
    lr holds between its steps; a `LambdaLR` whose lambda has a ceiling in its text (a `min` of
    two terms, a clamp, a branch, a step taken modulo a period), rising over a warm-up longer
    than the replay to a peak above the optimizer's lr (fairseq's inverse-sqrt written as a
    factor of a unit lr, the linear scaling rule's `world * min(1, (s + 1) / warmup)` with a long
    warm-up), and the same for the script's own lr writes (`g["lr"] = cyclical_lr(step)`: the
    written expression or the function it calls, a cycle written by hand); a rise of less than
    2×; an lr that fell at some step (a cycle);
    a run that ended on its own; an lr range test (every lr the script set at most 1e-5, or a
    schedule stepped in a function that stops when the loss diverges, `if loss > 4 * best_loss:
    break`, as torch-lr-finder's and fastai's finders do: it climbs exponentially on purpose,
    then training starts over); an optimizer that climbed, stopped stepping and handed training
    over to another optimizer whose first step came after its last (a range test of a fixed
    number of steps, then a fresh optimizer from restored weights).
    """

    code = "GD137"
    slug = "lr-grows-unbounded"
    severity = Severity.WARNING
    summary = "the lr applied keeps rising past every lr the script set, with nothing to cap it"
    fix = "cap the schedule: a factor below 1 for a decay, `min(1.0, ...)` around a warm-up"

    def check(self, a):
        seen = set()
        for grow in a.lr_growths:
            w = grow.writer
            key = (grow.opt, w.sched if w.scheduled else None)
            if key in seen:
                continue
            seen.add(key)
            loc, step_call = writer_location(a, w, grow.opt)
            if grow.turned:
                yield self._turned(a, grow, loc, step_call)
                continue
            yield self._finding(a, grow, loc, step_call)

    def _turned(self, a, grow, loc, step_call):
        """A decay from the first step that turned into a climb past every lr the script set."""
        w = grow.writer
        name = a.optimizer_name(grow.opt)
        groups = len(a.lr_timeline.get(grow.opt, {}))
        where = f"param group {grow.group} of {name}" if groups > 1 else name
        by = f"its {w.cls}" if w.scheduled else "the script's own lr assignments"
        built = loc
        branch = (a.source.factor_branch_line(loc.path, loc.line, "LambdaLR")
                  if w.scheduled and w.cls == "LambdaLR" and loc is not None else None)
        if branch is not None:  # the comparison that picks the lambda's warm-up or its decay
            loc = Location(loc.path, branch)
        message = (f"the lr of {where}, set by {by}, fell after the first step, then climbed "
                   f"to {grow.last:.3g} by the last of the {grow.updates} updates replayed, "
                   f"{grow.last / grow.top:.3g}× the largest lr the script set ({grow.top:g}), and "
                   f"was still rising: a decay that turns into a climb without a ceiling is a "
                   f"schedule whose pieces run in the wrong order (a warm-up branch taken after "
                   f"the warm-up)")
        test = a.source.line_text(loc.path, branch).strip() if branch is not None else ""
        shown = f" (`{test}`)" if test else ""
        fix = (f"check the comparison that picks the lambda's branch{shown}: the warm-up must "
               f"run while the step is below its length, the decay after it"
               if w.scheduled and w.cls == "LambdaLR" else
               "check the order of the schedule's pieces: a warm-up first, up to the lr you "
               "chose, then a decay that never climbs back")
        rel = [related(step_call, "its step() call")]
        if branch is not None and built is not None:
            rel.insert(0, Related(built, f"the {w.cls} given this lambda"))
        return self.finding(
            message, loc, fix=fix, related=tuple(rel),
            evidence={"optimizer": grow.opt, "group": grow.group, "top": grow.top,
                      "last": grow.last, "updates": grow.updates, "turned": True, "writer": w.cls if w.scheduled else "manual",
                      "observed": True})

    def _finding(self, a, grow, loc, step_call):
        w = grow.writer
        name = a.optimizer_name(grow.opt)
        groups = len(a.lr_timeline.get(grow.opt, {}))
        where = f"param group {grow.group} of {name}" if groups > 1 else name
        by = f"its {w.cls}" if w.scheduled else "the script's own lr assignments"
        times = grow.last / grow.top
        message = (f"the lr of {where}, set by {by}, rose at every step to {grow.last:.3g} by the "
                   f"last of the {grow.updates} updates replayed, {times:.3g}× the largest lr the "
                   f"script set ({grow.top:g}), and nothing caps it: it keeps growing while the "
                   f"script trains on")
        return self.finding(
            message, loc, severity=None if grow.observed else Severity.INFO,
            fix=_FIXES.get(w.cls, self.fix) if w.scheduled else _MANUAL_FIX,
            related=(related(step_call, "its step() call"),),
            evidence={"optimizer": grow.opt, "group": grow.group, "top": grow.top,
                      "last": grow.last, "updates": grow.updates,
                      "writer": w.cls if w.scheduled else "manual", "observed": grow.observed},
        )
