"""How a run ends: the ``RunStatus`` values, the exceptions that end a run early, and
``decide_status``, the one function that turns how a run ended into its status.

Every layer reads these (the recorder raises the stops, the report shows the status, the merge
joins the statuses of several processes), so this module sits on the bottom floor and imports
nothing of graddoctor.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable


class RunStatus(str, Enum):
    """A run's status. The values are the strings of the JSON report and its schema."""

    COMPLETED = "completed"  # the script ran to its end
    STEP_LIMIT = "step-limit"  # graddoctor stopped it after the step budget (--steps)
    BACKWARD_LIMIT = "backward-limit"  # many backward calls, an optimizer, and no step
    TIMEOUT = "timeout"  # the time limit (--timeout)
    CRASHED = "crashed"  # the script raised, or exited non-zero
    NO_TRAINING_LOOP = "no-training-loop"  # no backward and no optimizer step was seen
    MISSING = "missing"  # one process of a merged run: its report never arrived

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# a merged run's status is the first of these any process had (a crash anywhere is the run's)
STATUS_ORDER = (RunStatus.CRASHED, RunStatus.MISSING, RunStatus.TIMEOUT, RunStatus.BACKWARD_LIMIT,
                RunStatus.STEP_LIMIT, RunStatus.COMPLETED, RunStatus.NO_TRAINING_LOOP)

INCOMPLETE_STATUSES = (RunStatus.CRASHED, RunStatus.TIMEOUT)
"""The script stopped on its own (an exception, a non-zero exit, the time limit): whatever
followed was not checked. ``step-limit`` and ``backward-limit`` are graddoctor's own stops."""


class StopReplay(BaseException):
    """Raised into the user's script to end the replay (instrument/stop.py says when). A
    BaseException, so that a user's ``except Exception:`` cannot swallow it."""

    status = RunStatus.STEP_LIMIT


class StepLimitReached(StopReplay):
    status = RunStatus.STEP_LIMIT


class BackwardLimitReached(StopReplay):
    status = RunStatus.BACKWARD_LIMIT


class ReplayTimeout(StopReplay):
    status = RunStatus.TIMEOUT


class ScriptExit(BaseException):
    """``os._exit(code)`` called by the script: ends the run like ``sys.exit`` (no report
    would be written if the process really ended). Forked children exit for real."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Unfinished(BaseException):
    """What a provisional report assumes: the process ends before graddoctor does (killed, out
    of memory, stuck in code that holds Python's lock). Never raised."""


def exit_code(exc: BaseException) -> int | None:
    """The exit code of ``sys.exit``/``os._exit`` as python gives it (``sys.exit("message")``
    exits with 1)."""
    code = exc.code
    if code is None or isinstance(code, int):
        return code
    return 1


def worst(statuses: Iterable[str]) -> RunStatus:
    """The first of ``statuses`` in ``STATUS_ORDER``."""
    return min((RunStatus(s) for s in statuses), key=STATUS_ORDER.index)


def decide_status(ended_by: BaseException | None = None, *, stop_raised: str | None = None,
                  trained: bool = True, parts: Iterable[str] = ()) -> RunStatus:
    """The status of a run: the one place it is decided.

    ``ended_by``: what ended the target (None: it returned; a ``sys.exit(0)`` or ``os._exit(0)``
    is a return too). A stop of graddoctor's carries its status; anything else is a crash.
    ``stop_raised``: the status of a stop raised in a thread of the script whose main thread
    then returned (it joined the thread, or swallowed the stop): the replay was still cut.
    ``trained``: a backward, an optimizer step or a functional gradient was seen; a run that
    returned without one is ``no-training-loop``.
    ``parts``: the statuses of the processes merged into one report (ranks, workers): the worst
    of those that trained (a crash anywhere is the run's); a lost process makes it crashed.
    """
    parts = [RunStatus(s) for s in parts]
    if parts:
        status = worst([s for s in parts if s is not RunStatus.NO_TRAINING_LOOP] or parts)
        return RunStatus.CRASHED if status is RunStatus.MISSING else status
    if isinstance(ended_by, StopReplay):
        return ended_by.status
    if ended_by is not None and not (isinstance(ended_by, (SystemExit, ScriptExit))
                                     and exit_code(ended_by) in (0, None)):
        return RunStatus.CRASHED
    if stop_raised:
        return RunStatus(stop_raised)
    return RunStatus.COMPLETED if trained else RunStatus.NO_TRAINING_LOOP
