"""How far the run has got, and when to end it: optimizer steps, backward calls and updates
counted, and the stop conditions (``instrument/stop.py``) asked after each.

It is the recorder's (``Recorder.progress``); the optimizer, GradScaler and backward watchers
count through it (``count_step``, ``count_backward``) and end the replay at their safe points
(``maybe_stop``); the run side reads the counts and how the replay ended (``stop_raised``).
"""

from __future__ import annotations

import heapq
import threading
from itertools import count
from threading import get_ident
from typing import TYPE_CHECKING, Callable

from .stop import SPENT, StopCondition, StopReplay, conditions
from .topics import BUDGET_HOLD, COUNTED_STEP

if TYPE_CHECKING:
    from .recorder import Recorder


class Progress:
    def __init__(self, rec: "Recorder", step_budget: int | None,
                 stop_conditions: list[StopCondition] | None = None, hold_s: float | None = None):
        self._rec = rec  # its errors go in the trace; the stop conditions read the run through it
        self.step_budget = step_budget  # in updates (see ``count_step``)
        self.steps = 0  # optimizer steps seen (GradScaler-skipped ones included)
        self.backward_calls = 0
        # updates: the optimizer steps taken together after one backward count once (a GAN's
        # D then G are two; one optimizer per parameter stepped inside the backward is one); a
        # second step of an optimizer already stepped in this update begins the next one
        self.updates = 0
        self._update_mark = -1  # backward_calls when the current update began
        self._update_opts: set = set()  # the optimizers stepped in the current update
        self.opt_steps: dict[int, int] = {}  # opt id -> its steps
        self._skipped_steps: dict[int, int] = {}  # opt id -> its steps a GradScaler skipped
        # when to end the replay early (instrument/stop.py); the first one that answers wins and
        # its exception is raised at the next safe point
        self.stop_conditions = (conditions(step_budget, hold_s) if stop_conditions is None
                                else stop_conditions)
        self._stop: tuple[type[StopReplay], str] | None = None
        self.stop_requested = False  # whether _stop is set (read by every hook: an attribute)
        # the status of the stop once raised into the script, and the threads it was raised in
        # (the main thread may end normally after workers were stopped: the replay was still cut)
        self.stop_raised: str | None = None
        self.stopped_threads: set[int] = set()
        # per moment, only the conditions that answer it, each with its answer read once
        # (count_backward runs every backward)
        self._asked = {moment: [(c, getattr(c, moment)) for c in self.stop_conditions
                                if getattr(type(c), moment) is not getattr(StopCondition, moment)]
                       for moment in ("after_step", "after_backward")}
        self._after_step, self._after_backward = self._asked["after_step"], self._asked["after_backward"]
        self._counted_step = rec.subscribers(COUNTED_STEP)
        self._budget_hold = rec.subscribers(BUDGET_HOLD)
        # what count_step does past the counts, only once ``steps`` reaches ``_wake``: every
        # step (0) while a COUNTED_STEP subscriber or a step-time stop condition is there, else
        # at the earliest alarm (``wake_at``), else never
        self._alarms: list[tuple[int, int, Callable[[], None]]] = []  # (steps, order, callback)
        self._order = count()
        self._wake = 0
        self._counted_step.on_change(self._rewake)
        # the thread of the first step the optimizers took (not a GradScaler-skipped one), and
        # whether another thread has stepped since (watchers that must not read a ``.grad``
        # another thread may be writing stop for good)
        self._step_thread: int | None = None
        self.threads_stepped = False
        self._rewake()

    def begins_update(self, opt: int | None) -> bool:
        """Whether a step of optimizer ``opt`` now would begin a new update."""
        return (self.backward_calls != self._update_mark or opt is None
                or opt in self._update_opts)

    def count_step(self, opt: int | None = None, skipped: bool = False) -> None:
        """One optimizer step (``skipped``: one a GradScaler skipped, the optimizer's own step
        not run)."""
        self.steps += 1
        opts = self._update_opts
        if self.backward_calls != self._update_mark or opt is None or opt in opts:  # begins_update
            self.updates += 1
            self._update_mark = self.backward_calls
            opts.clear()
        if opt is not None:
            opts.add(opt)
            steps = self.opt_steps
            steps[opt] = steps.get(opt, 0) + 1
            if skipped:
                self._skipped_steps[opt] = self._skipped_steps.get(opt, 0) + 1
        if not skipped and get_ident() != self._step_thread:
            self._new_step_thread()
        if self.steps >= self._wake:
            self._woken()

    def count_thread_step(self, opt: int, ident: int) -> None:
        """``count_step(opt)`` of a step no GradScaler skipped, run by thread ``ident`` (the
        straight-line step hooks': the script's thread, tested by their pre hook)."""
        self.steps += 1
        opts = self._update_opts
        if self.backward_calls != self._update_mark or opt in opts:  # begins_update
            self.updates += 1
            self._update_mark = self.backward_calls
            opts.clear()
        opts.add(opt)
        steps = self.opt_steps
        steps[opt] = steps.get(opt, 0) + 1
        if ident != self._step_thread:
            self._new_step_thread()
        if self.steps >= self._wake:
            self._woken()

    def _woken(self) -> None:
        """``count_step``'s work past the counts: the COUNTED_STEP subscribers, the step-time
        stop conditions, then the alarms due."""
        for callback in self._counted_step.now:
            try:
                callback(self.updates)
            except Exception as exc:  # a display must never break the user's run
                self._rec.internal_error("step callback", exc)
        if self._stop is None and self._after_step:
            self._ask(self._after_step)
        alarms = self._alarms
        if alarms and alarms[0][0] <= self.steps:
            while alarms and alarms[0][0] <= self.steps:
                callback = heapq.heappop(alarms)[2]
                try:
                    callback()
                except Exception as exc:
                    self._rec.internal_error("step alarm", exc)
            self._rewake()  # (what else changes it rewakes itself: _ask, _drop, the topic)

    def _rewake(self) -> None:
        if self._counted_step.now or (self._stop is None and self._after_step):
            self._wake = 0
        else:
            self._wake = self._alarms[0][0] if self._alarms else float("inf")

    def wake_at(self, steps: int, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called from ``count_step`` once ``steps`` optimizer steps are
        counted (GradScaler-skipped ones included; ``steps`` now or before: at the next step),
        after the COUNTED_STEP subscribers and before the step's ``STEPPED`` subscribers: a
        watcher that acts on a schedule of step counts stays off ``STEPPED`` between them and
        resumes itself there. Called once; from the stepping thread."""
        heapq.heappush(self._alarms, (steps, next(self._order), callback))
        self._rewake()

    def steps_taken(self) -> int:
        """The steps the optimizers ran so far, GradScaler-skipped ones not counted: how many
        ``STEPPED`` publications there have been once the running step's is made."""
        return self.steps - sum(self._skipped_steps.values())

    def _new_step_thread(self) -> None:
        if self._step_thread is None:
            self._step_thread = get_ident()
        else:
            self.threads_stepped = True

    def stepped(self, opt: int) -> int:
        """The steps optimizer ``opt`` ran so far (the one whose post hook is running
        included; GradScaler-skipped ones not): the count each of the optimizer watcher's
        ``STEPPED`` publications for ``opt`` would have added up to. Watchers that count
        steps read it here instead of counting every step themselves, so that they can stay
        off the step topics while they have nothing else to do."""
        return self.opt_steps.get(opt, 0) - self._skipped_steps.get(opt, 0)

    def count_backward(self) -> None:
        self.backward_calls += 1
        if self._stop is None and self._after_backward:
            self._ask(self._after_backward)

    def _ask(self, asked: list) -> None:
        """Each stop condition's answer at this moment (``asked``: the conditions with their
        method for it), until one answers. One that answers ``SPENT`` is asked no more at this
        moment."""
        rec = self._rec
        for condition, answer in asked:
            try:
                reason = answer(rec)
            except Exception as exc:
                rec.internal_error("stop condition", exc)
                continue
            if reason:
                self._stop = (condition.exception, reason)
                self.stop_requested = True
                self._rewake()
                return
            if reason is SPENT:
                self._drop(asked, condition)

    def _drop(self, asked: list, condition: StopCondition) -> None:
        """``condition`` is asked no more at the moment whose list is ``asked`` (a new list:
        the one being looped over stays as it is)."""
        for moment, pairs in self._asked.items():
            if pairs is asked:
                self._asked[moment] = [pair for pair in pairs if pair[0] is not condition]
        self._after_step, self._after_backward = self._asked["after_step"], self._asked["after_backward"]
        self._rewake()

    def holds(self):
        """Whether each ``budget_hold`` subscriber wants the replay to go on past the budget."""
        for hold in self._budget_hold.now:
            try:
                yield hold()
            except Exception as exc:
                self._rec.internal_error("step budget", exc)
                yield False

    def divert_stop(self, handler: Callable[[type[StopReplay]], None] | None) -> None:
        """End the replay through ``handler(exception)`` at the safe point instead of raising
        the stop into the script (a spawned worker writes its report and exits there); with
        None, never end it (a forked copy of the process: nobody reads its trace)."""
        if handler is None:
            self._asked = {moment: [] for moment in self._asked}
            self._after_step, self._after_backward = [], []
            self._stop = None
            self.stop_requested = False
            self._rewake()
            return

        def maybe_stop(step_of: int | None = None) -> None:
            if self._stop is not None and (step_of is None or self.begins_update(step_of)):
                handler(self._stop[0])

        self.maybe_stop = maybe_stop

    def maybe_stop(self, step_of: int | None = None) -> None:
        """Called at safe points (start of a backward or a step): end the replay once a stop
        condition answered, so the tail of the last update (zero_grad, scheduler) is seen.
        ``step_of``: the optimizer about to step; a step that belongs to the running update
        (the next optimizer stepped inside the same backward) is not a safe point."""
        if self._stop is not None and (step_of is None or self.begins_update(step_of)):
            exception, reason = self._stop
            self.stop_raised = exception.status
            self.stopped_threads.add(threading.get_ident())
            raise exception(reason)
