"""When the replay ends before the script does: pluggable stop conditions.

The recorder asks each condition after every optimizer step and every backward call; the first
that gives a reason ends the replay at the next safe point (the start of a backward or a step, so
the tail of the last update — zero_grad, a scheduler step — is still seen), by raising its
``StopReplay`` into the script. The exception carries the run status the report shows.

To add one: a class with ``after_step`` / ``after_backward`` returning a reason or None, an
exception class with its ``status`` (graddoctor/status.py, beside the others: a new status is
a new ``RunStatus``), and an entry in ``conditions()``. A condition that can never answer again
at a moment returns ``SPENT`` there and is asked no more at it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..status import BackwardLimitReached, ReplayTimeout, StepLimitReached, StopReplay  # noqa: F401

if TYPE_CHECKING:
    from .recorder import Recorder

# A loop that runs this many backward calls without a single optimizer step, although an
# optimizer exists, will not step: an accumulation window of 64 or 256 micro-batches still
# reaches its first step well before it.
NO_STEP_BACKWARDS = 512

# Past the budget, the replay waits for each optimizer that has not stepped twice yet (a GAN's
# generator stepped once per 20 discriminator steps: a missing G.zero_grad() shows at its second
# step) for at most this many times the budget in updates (and at least HOLD_MIN_UPDATES), and
# within the time the time limit leaves (``hold_s``).
HOLD_FACTOR = 8
HOLD_MIN_UPDATES = 100


class _Spent:
    """What a condition answers once it never will again (falsy, like no answer): it is then
    asked no more at that moment (``Progress`` drops it), so a long run asks nothing that can
    no longer stop it."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "SPENT"


SPENT = _Spent()


class StopCondition:
    exception: type[StopReplay] = StopReplay

    def after_step(self, rec: "Recorder") -> str | None:
        return None

    def after_backward(self, rec: "Recorder") -> str | None:
        return None


class StepBudget(StopCondition):
    """``--steps N``: stop after N updates (the recorder's ``updates``: the steps taken together
    after one backward count once, so one optimizer per parameter stepped inside the backward
    is one update, not 24), unless a watcher holds the replay open (the recorder's
    ``budget_hold`` topic: e.g. until a DataLoader has crossed two epoch ends) or an optimizer
    alive when the budget ran out has not stepped twice yet (for at most ``HOLD_FACTOR`` times
    the budget and ``hold_s`` seconds from the start)."""

    exception = StepLimitReached

    def __init__(self, budget: int, hold_s: float | None = None):
        self.budget = budget
        self.deadline = None if hold_s is None else time.monotonic() + hold_s
        self.waiting: list[int] | None = None  # optimizers waited for, fixed at the budget

    def after_step(self, rec: "Recorder") -> str | None:
        # every hold is asked (no short cut): one that decides at the budget must see it
        if rec.progress.updates < self.budget or any([*rec.progress.holds()]):
            return None
        if self._wait_for_optimizers(rec):
            return None
        return f"stopped after {rec.progress.updates} updates ({rec.progress.steps} optimizer steps)"

    def _wait_for_optimizers(self, rec: "Recorder") -> bool:
        """Whether an optimizer that lived when the budget ran out is still alive with fewer
        than two steps, within the limits. One rebuilt every update dies at the next one; one
        whose parameters another has stepped is not waited for."""
        if rec.progress.updates >= max(self.budget * HOLD_FACTOR, HOLD_MIN_UPDATES):
            return False
        if self.deadline is not None and time.monotonic() > self.deadline:
            return False
        if self.waiting is None:
            self.waiting = [opt for opt in rec.opt_params if rec.progress.opt_steps.get(opt, 0) < 2]
        ids = rec.optimizer_id
        steps = rec.progress.opt_steps
        # an optimizer whose parameters all belong to one that stepped (SAM's or Lookahead's
        # wrapper around its base optimizer, sharing its param_groups) never needs its own step
        stepped = {pid for opt, pids in rec.opt_params.items() if steps.get(opt, 0) >= 2 for pid in pids}
        self.waiting = [opt for opt in self.waiting
                        if steps.get(opt, 0) < 2 and ids.object(opt) is not None
                        and not (rec.opt_params.get(opt) and set(rec.opt_params[opt]) <= stepped)]
        return bool(self.waiting)


class NoStepLimit(StopCondition):
    """Backward calls go on and on, an optimizer exists, and none ever steps: the verdict is
    already clear, so the check ends in seconds instead of at the time limit. Scripts without
    ``torch.optim`` (hand-written SGD) are never stopped by it."""

    exception = BackwardLimitReached

    def __init__(self, backwards: int = NO_STEP_BACKWARDS):
        self.backwards = backwards

    def after_backward(self, rec: "Recorder") -> str | None:
        if rec.progress.steps:  # the steps counted never go back to 0: it cannot answer again
            return SPENT
        if rec.progress.backward_calls >= self.backwards and rec.opt_params:
            return (f"stopped after {rec.progress.backward_calls} backward calls without any optimizer step "
                    f"(an optimizer was created but never stepped)")
        return None


def conditions(step_budget: int | None, hold_s: float | None = None) -> list[StopCondition]:
    """The stop conditions of a check (``hold_s``: how long from now the step budget may wait
    for optimizers that have not stepped twice)."""
    out: list[StopCondition] = [NoStepLimit()]
    if step_budget:
        out.insert(0, StepBudget(step_budget, hold_s))
    return out
