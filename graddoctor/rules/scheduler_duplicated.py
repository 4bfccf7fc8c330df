from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

# schedules whose shape lies in a callable or in arguments the trace does not record: the
# constructor calls' text must agree as well (two LambdaLRs with two lambdas are a warm-up and
# a decay)
_SHAPE_IN_CODE = frozenset({"LambdaLR", "MultiplicativeLR", "CyclicLR", "OneCycleLR"})
# schedules that set the lr from the start value at each step (not chainable)
_ABSOLUTE = frozenset({"LambdaLR", "CyclicLR", "OneCycleLR"})
# schedulers that hold others, or that take a metric: not a schedule of their own
_NOT_SCHEDULES = frozenset({"SequentialLR", "ChainedScheduler", "ReduceLROnPlateau"})


class SchedulerDuplicated(Rule):
    """
    ## What it does
    Finds two learning-rate schedulers of the same class, built with the same arguments, that
    drive one optimizer and are both stepped: a copy of a scheduler line whose optimizer was
    not changed (`sched_d = StepLR(opt_g, ...)` beside `sched_g = StepLR(opt_g, ...)`), or a
    comprehension that builds one scheduler per optimizer but binds every one to the same
    optimizer. It points at the second construction and names the stepped optimizers that no
    scheduler drives.

    ## Why is this bad?
    A chainable schedule (`StepLR`, `ExponentialLR`, `MultiStepLR`, `CosineAnnealingLR`...)
    multiplies the lr it finds: stepped by two schedulers, the optimizer's lr decays twice at
    every step (gamma squared), reaching its floor long before the run ends. A schedule that
    sets the lr from the start value (`LambdaLR`) is applied twice to the same value: the copy
    does nothing, and the schedule the script meant to write (a decay beside a warm-up) is
    missing. The optimizer the copy was meant for keeps its initial lr for the whole run.
    Nothing fails; the curves look like a slightly worse run.

    ## Example
    ```python
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    sched_d = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    ```

    ## Use instead
    ```python
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    sched_d = torch.optim.lr_scheduler.StepLR(opt_d, step_size=10, gamma=0.5)
    ```

    ## Stays silent on
    The same schedule built for two optimizers (one scheduler each); two schedulers of one
    optimizer of different classes or arguments (a warm-up chained with a decay, two `LambdaLR`s
    with two lambdas); the schedulers a `SequentialLR` or `ChainedScheduler` holds;
    `ReduceLROnPlateau`; a scheduler built again that replaces the previous one (only the new
    one is stepped).
    """

    code = "GD148"
    slug = "scheduler-duplicated"
    severity = Severity.WARNING
    summary = ("two schedulers with the same class and arguments drive one optimizer and are both "
               "stepped: its lr follows the schedule twice, and the optimizer the copy was meant "
               "for follows none")
    fix = "build the second scheduler over the optimizer it is meant for, or remove the copy"

    def check(self, a):
        scheds = a.schedulers
        driven = {s.opt for s in scheds.values() if s.count and s.opt is not None}
        stepped = {st["opt"] for st in a.steps}
        groups: dict[tuple, list] = {}
        for s in scheds.values():
            if s.parent is not None or s.opt is None or s.init is None or s.init.loc is None \
                    or s.cls in _NOT_SCHEDULES or not s.count:
                continue
            groups.setdefault((s.opt, s.cls), []).append(s)
        for (opt, cls), members in groups.items():
            members.sort(key=lambda s: s.init.seq)
            pair = self._twin_schedules(a, members)
            if pair is None:
                continue
            first, second = pair
            name = a.optimizer_name(opt)
            orphans = sorted(o for o in stepped if o != opt and o not in driven)
            if orphans:
                meant = ", ".join(a.optimizer_name(o) for o in orphans)
                tail = (f"; {meant} steps with no scheduler at all: the copy was probably meant "
                        f"for it")
            else:
                tail = ""
            effect = ("both set the lr from its start value, so the copy changes nothing and "
                      "no other schedule is applied" if cls in _ABSOLUTE else
                      "its lr is scaled by the schedule twice at every step (the decay squared)")
            yield self.finding(
                f"this {cls} is built over {name} with the same arguments as the {cls} at line "
                f"{first.init.loc.line}, and both are stepped ({first.count} and {second.count} "
                f"times): {effect}{tail}",
                second.init.loc,
                related=(related(first.init, f"the first {cls} over {name}"),),
                evidence={"scheduler": cls, "optimizer": opt, "orphans": orphans,
                          "args": dict(second.args)},
                fix=(f"build this scheduler over {a.optimizer_name(orphans[0])}, the optimizer it is "
                     f"meant for, or remove it if one schedule is meant" if len(orphans) == 1
                     else "build this scheduler over the optimizer it is meant for, or remove it "
                          "if one schedule is meant"))

    @staticmethod
    def _twin_schedules(a, members):
        """The first two schedulers of ``members`` (one optimizer, one class) built with the same
        arguments and stepped alike, or None."""
        for i, first in enumerate(members):
            for second in members[i + 1:]:
                shape_1 = {k: v for k, v in first.args.items() if k != "last_epoch"}
                shape_2 = {k: v for k, v in second.args.items() if k != "last_epoch"}
                if shape_1 != shape_2:
                    continue
                if not (0.5 <= first.count / second.count <= 2.0):
                    continue  # stepped at other cadences: not two copies of one schedule
                if first.steps and second.steps and max(e.seq for e in first.steps) < second.init.seq:
                    continue  # the first was dropped when the second was built: a rebuild
                same_line = (first.init.loc.path, first.init.loc.line) == \
                    (second.init.loc.path, second.init.loc.line)
                if not same_line or first.cls in _SHAPE_IN_CODE or not shape_1:
                    text_1 = a.source.schedule_arguments(first.init.loc.path, first.init.loc.line, first.cls)
                    text_2 = a.source.schedule_arguments(second.init.loc.path, second.init.loc.line, second.cls)
                    if text_1 is None or text_1 != text_2:
                        continue
                return first, second
        return None
