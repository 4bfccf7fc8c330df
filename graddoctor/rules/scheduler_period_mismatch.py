from __future__ import annotations

import math

from ..analysis.lr import cadence, length, per_micro_batch, schedule_misfit
from ..findings import Severity
from .base import Rule, related

MIN_REAL_LEN = 8  # batches per epoch below which an equality with a length may be chance
MIN_UNSHORTENED = 20  # the same when nothing says the length came from len(loader)
LONG = 1000  # a length this long, a multiple of the epoch's batches, counts batches


_COSINE_PER_BATCH = ("count the schedule's length in the unit you step it in: "
                     "T_max=epochs * len(loader) when stepped per batch, T_max=epochs when stepped "
                     "per epoch")
_PER_EPOCH_FIX = "step it after every optimizer.step(), or count its length in epochs"
_LIGHTNING_PER_BATCH = ('in configure_optimizers, return the scheduler with "interval": "epoch" '
                        "(Lightning's default: one step per epoch), or keep \"interval\": \"step\" "
                        "and size the schedule in optimizer steps "
                        "(self.trainer.estimated_stepping_batches)")
_LIGHTNING_PER_EPOCH = ('in configure_optimizers, return the scheduler with "interval": "step" '
                        "(Lightning then steps it after every optimizer step), or count its "
                        "length in epochs")


class SchedulerPeriodMismatch(Rule):
    """
    ## What it does
    Finds a schedule whose length is counted in one unit and stepped in another, judged from
    how often the scheduler really steps against the DataLoader's epochs:

    * stepped after every batch while its period is shorter than one epoch of batches:
      `CosineAnnealingLR(T_max=num_epochs)` stepped per batch reaches `eta_min` after `T_max`
      batches and climbs back, over and over; `MultiStepLR` milestones, `StepLR` /
      `ExponentialLR` decays meant per epoch all pass in the first epoch;
    * stepped once per epoch while its length is the DataLoader's batch count
      (`CosineAnnealingLR(T_max=len(train_loader))`, `OneCycleLR(total_steps=epochs *
      len(loader))` stepped per epoch): the schedule barely moves during training.

    What the replay saw (the lr passed a whole period) is a warning; a projection from the
    DataLoader's real length is said as one, and the decays of `StepLR`/`ExponentialLR`/
    `MultiStepLR` are `info`.

    ## Why is this bad?
    The lr the optimizer applies is not the schedule you designed: a cosine restarting every few
    batches trains with a lr that swings between its maximum and 0 all run long; a decay meant
    over 90 epochs done in the first one leaves a lr 1000× too small; a cosine over 390 epochs
    in a 100-epoch run hardly anneals at all.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=num_epochs)
    for epoch in range(num_epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()         # per batch, period in epochs
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=num_epochs * len(loader))   # or step it once per epoch
    ```

    ## Stays silent on
    `OneCycleLR` / cosine sized in batches and stepped per batch; `T_max=epochs` per epoch;
    `SequentialLR`/`ChainedScheduler` children; schedules sized in updates (or in
    micro-batches and stepped so) under accumulation; an optimizer rebuilt with its
    scheduler.
    """

    code = "GD223"
    slug = "scheduler-period-mismatch"
    severity = Severity.WARNING
    summary = "a schedule's length is in epochs but it is stepped per batch, or the reverse"
    fix = _COSINE_PER_BATCH
    fixes = {"lightning": _LIGHTNING_PER_BATCH}

    def check(self, a):
        for s in a.schedulers.values():
            found = period_verdict(a, s)
            if found is None:
                continue
            message, severity, fix = found
            if severity is Severity.INFO and schedule_misfit(a, s) is not None:
                continue  # projected over the planned run: schedule-misfits-run says it, a warning
            c = cadence(a, s)
            # where Lightning steps the schedule itself (automatic optimization), the unit is
            # the "interval" of the lr_scheduler config, not where a step() call sits
            first = s.steps[0]
            by_lightning = first.loc is not None and first.loc.hook == "configure_optimizers"
            lightning = (_LIGHTNING_PER_EPOCH if fix == _PER_EPOCH_FIX else _LIGHTNING_PER_BATCH)
            yield self.finding(
                message, (s.init or s.steps[0]).loc if s.init is not None and s.init.loc else s.steps[0].loc,
                severity=severity, fix=fix, fixes={"lightning": lightning} if by_lightning else {},
                related=(related(s.steps[0], "its step() call"),),
                evidence={"scheduler": s.cls, "optimizer": s.opt, "args": dict(s.args),
                          "per_update": round(c.per_update, 3), "real_len": c.real_len},
            )

    @classmethod
    def verdict(cls, a, s):
        """``(message, severity or None for the rule's, fix)`` for a scheduler whose length is
        in another unit than its steps, or None."""
        if not s.positional or not s.steps or s.parent is not None:
            return None
        c = cadence(a, s)
        if c is None or per_micro_batch(a, s) is not None:
            return None  # stepped per micro-batch: scheduler-per-micro-batch says it
        found = cls._per_batch(a, s, c) if c.per_update >= 0.9 and \
            (c.epoch_most >= 3 or (c.epochs_seen == 0 and c.updates >= 3)) else None
        if found is None and c.epoch_most == 1 and c.epoch_updates >= 3 and c.epochs_seen >= 1:
            found = cls._per_epoch(a, s, c)
        return found

    @staticmethod
    def _per_batch(a, s, c):
        args = s.args
        per_epoch = int(round(min(1.0, c.per_backward) * c.real_len)) if c.real_len else None
        seen = s.count
        epoch_words = f"one epoch of {per_epoch} batches" if per_epoch else "the replay"
        if s.cls == "CosineAnnealingLR" and isinstance(args.get("T_max"), int) and args["T_max"] > 0:
            t = args["T_max"]
            if any(t % m == 0 for m in c.lengths()):
                return None  # sized with len(loader): epochs * len(loader) batches
            if seen > t:
                return (f"CosineAnnealingLR(T_max={t}) is stepped after every batch: the lr reached "
                        f"eta_min after {t} batches and climbed back within the replay's {seen} "
                        f"steps; T_max looks like a count of epochs", None, _COSINE_PER_BATCH)
            if per_epoch and t < per_epoch and t < LONG:
                # a T_max in the thousands is a step budget (a loop that stops at max_steps
                # inside a long epoch), not a count of epochs
                cycles = per_epoch / (2 * t)
                return (f"CosineAnnealingLR(T_max={t}) is stepped after every batch: projected over "
                        f"{epoch_words}, the lr falls to eta_min after {t} batches and climbs back, "
                        f"about {cycles:.3g} full cycles per epoch; T_max looks like a count of "
                        f"epochs", None, _COSINE_PER_BATCH)
            return None
        if per_epoch is None:
            return None
        if s.cls == "MultiStepLR" and args.get("milestones"):
            last = max(args["milestones"])
            if 0 < last < per_epoch:
                return (f"MultiStepLR(milestones={args['milestones']}) is stepped after every batch: "
                        f"projected, every milestone passes within the first epoch "
                        f"({per_epoch} batches), and the lr stays at its last, smallest value "
                        f"from then on; the milestones look like epochs", Severity.INFO,
                        "give the milestones in optimizer steps (epoch * len(loader)) when stepped "
                        "per batch, or step the scheduler once per epoch")
        gamma = args.get("gamma")
        if any(col.writer.sched == s.sched for col in a.lr_collapses):
            return None  # seen collapse in the replay: lr-collapsed says it
        if isinstance(gamma, (int, float)) and 0 < gamma < 1:
            if s.cls == "StepLR" and isinstance(args.get("step_size"), int) and args["step_size"] > 0:
                decays = per_epoch // args["step_size"]
            elif s.cls == "ExponentialLR":
                decays = per_epoch
            else:
                return None
            left = gamma ** decays
            if decays >= 1 and left < 0.01:
                return (f"{s.cls} is stepped after every batch: projected over one epoch of "
                        f"{per_epoch} batches the lr is multiplied by {gamma:g} {decays} times, "
                        f"down to {left:.2g} of its start by the end of the first epoch; its "
                        f"{'step_size' if s.cls == 'StepLR' else 'gamma'} looks meant per epoch",
                        Severity.INFO,
                        "step the scheduler once per epoch, or size step_size in optimizer steps "
                        "(epochs * len(loader))" if s.cls == "StepLR" else
                        "step the scheduler once per epoch, or take gamma per step "
                        "(gamma ** (1 / len(loader)) for the same decay per epoch)")
        return None

    @staticmethod
    def _epoch_lengths(c) -> list[int]:
        """The epoch lengths that a length equal to (or a long multiple of) shows was computed
        from len(loader). In a shortened replay len(loader) returned the replay's length, so
        only that one tells: the real length equal to a length may be a count of epochs by
        chance (100 epochs of 100 batches). Unshortened (``--epoch-batches 0``, or a loader
        shorter than the replay's epochs), the real length, when it is long enough."""
        if c.replay_len and c.real_len and c.replay_len < c.real_len:
            return [c.replay_len] if c.replay_len >= MIN_REAL_LEN else []
        real = c.real_len or c.replay_len
        return [real] if real and real >= MIN_UNSHORTENED else []

    @classmethod
    def _per_epoch(cls, a, s, c):
        n = length(s)
        if n is None:
            return None
        k = max(1, int(round(c.per_update / c.per_backward))) if c.per_backward else 1
        unit, span = None, n
        for real in cls._epoch_lengths(c):
            updates = max(1, real // k)
            if n == real or (n >= LONG and n % real == 0):
                unit = f"len(loader): {real} batches per epoch" + (
                    f" in the replay's shortened epochs ({c.real_len} in a real one)"
                    if c.real_len and c.real_len != real else "")
                if c.real_len and n % real == 0:
                    span = n // real * c.real_len
            elif n == updates or (n >= LONG and n % updates == 0):
                unit = f"the {updates} optimizer updates of an epoch"
            if unit:
                break
        if unit is None:
            return None
        name = next((k for k in ("total_steps", "T_max", "total_iters", "num_training_steps")
                     if s.args.get(k) == n), "length")
        progress = ""
        if s.cls == "CosineAnnealingLR" and span > 100:
            after = 0.5 * (1 + math.cos(math.pi * 100 / span))
            progress = f" (after 100 epochs the lr is still {after:.0%} of its start)"
        return (f"{s.cls}({name}={n}) counts batches ({unit}), but its step() runs once per "
                f"epoch: in a real run the schedule spans {span} epochs{progress}",
                None, _PER_EPOCH_FIX)


period_verdict = SchedulerPeriodMismatch.verdict
