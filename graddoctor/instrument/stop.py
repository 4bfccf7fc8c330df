"""When the replay ends before the script does: pluggable stop conditions.

The recorder asks each condition after every optimizer step and every backward call; the first
that gives a reason ends the replay at the next safe point (the start of a backward or a step, so
the tail of the last update — zero_grad, a scheduler step — is still seen), by raising its
``StopReplay`` into the script. The exception carries the run status the report shows.

To add one: a class with ``after_step`` / ``after_backward`` returning a reason or None, an
exception class with its ``status`` (graddoctor/status.py, beside the others: a new status is
a new ``RunStatus``), and an entry in ``conditions()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..status import BackwardLimitReached, ReplayTimeout, StepLimitReached, StopReplay  # noqa: F401

if TYPE_CHECKING:
    from .recorder import Recorder

# A loop that runs this many backward calls without a single optimizer step, although an
# optimizer exists, will not step: an accumulation window of 64 or 256 micro-batches still
# reaches its first step well before it.
NO_STEP_BACKWARDS = 512


class StopCondition:
    exception: type[StopReplay] = StopReplay

    def after_step(self, rec: "Recorder") -> str | None:
        return None

    def after_backward(self, rec: "Recorder") -> str | None:
        return None


class StepBudget(StopCondition):
    """``--steps N``: stop after N optimizer steps, unless a watcher holds the replay open
    (the recorder's ``budget_hold`` topic: e.g. until a DataLoader has crossed two epoch ends)."""

    exception = StepLimitReached

    def __init__(self, budget: int):
        self.budget = budget

    def after_step(self, rec: "Recorder") -> str | None:
        if rec.steps >= self.budget and not any(rec.holds()):
            return f"stopped after {rec.steps} optimizer steps"
        return None


class NoStepLimit(StopCondition):
    """Backward calls go on and on, an optimizer exists, and none ever steps: the verdict is
    already clear, so the check ends in seconds instead of at the time limit. Scripts without
    ``torch.optim`` (hand-written SGD) are never stopped by it."""

    exception = BackwardLimitReached

    def __init__(self, backwards: int = NO_STEP_BACKWARDS):
        self.backwards = backwards

    def after_backward(self, rec: "Recorder") -> str | None:
        if rec.steps == 0 and rec.backward_calls >= self.backwards and rec.opt_params:
            return (f"stopped after {rec.backward_calls} backward calls without any optimizer step "
                    f"(an optimizer was created but never stepped)")
        return None


def conditions(step_budget: int | None) -> list[StopCondition]:
    """The stop conditions of a check."""
    out: list[StopCondition] = [NoStepLimit()]
    if step_budget:
        out.insert(0, StepBudget(step_budget))
    return out
