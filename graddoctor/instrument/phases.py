"""Later phases of a run: the step budget waits for the end of the first pass of the loop around
the training loop, for the first evaluation, or for a later training phase of the script.

A script that draws or slices its batches by hand (``for epoch in range(E): for i in range(0,
n, bs)``, ``for episode in range(E): for t in range(T)``, a ``while`` loop) has no DataLoader
epoch for the budget to wait for (instrument/dataloader.py), so ``--steps`` used to end it at
update 10 — before its first evaluation, its epoch-end scheduler step, the ``model.train()``
that the evaluation forgets, a stage switch. Nothing of this runs per step before the budget:
the watcher is a ``budget_hold`` subscriber, asked only once the budget is reached.

At the budget (once), the source of the user's frames on the stack of that optimizer step
(instrument/planned.py's loop finder) gives the loops around the step, from the innermost
outward, across function calls (``train_one_epoch()`` called in ``for epoch in ...``), up to
the script's top level (a caller that runs the script in-process is not the script):

* the loop around the training loop (the second loop out): the replay goes on until that
  loop has begun its next pass — its variable (``epoch``, ``episode``; for a ``while`` loop a
  name its body counts up, ``epoch += 1``) read from its frame after each step holds another
  value. The step that sees it is one training update of the new pass (its forward, backward
  and step): a forgotten ``model.train()``, a stage switch at the top of the pass, shows there.
  A ``range`` loop in its last pass has no next one: not waited for.
  When the training loop is a ``range`` whose remaining length the frame's values give, and
  that length reaches past the cap, it waits for nothing (the cap would cut it anyway);
* otherwise, when the training loop's body holds a stage switch on its counter (``if step ==
  K:``, ``>=``, ``>``; the counter its ``for`` variable or a name it counts up, K read from the
  frame's values and ahead within the cap), until the counter has gone past K: the switch ran
  and an update after it was seen;
* otherwise, when the training loop's body (or a function of the script it calls, two calls
  deep) calls ``.eval()`` / ``.train(False)`` and none has run since the first step, until one
  has (an ``eval`` event, or a no-grad forward of a BatchNorm/dropout model: ``mode_forward``),
  and one more step after it.

Whatever the running phase waits for, and also in a DataLoader script, a later phase of the
script is waited for: a statement after the one running (for a frame with loops, after its
outermost loop) in the block of a script frame on the step's stack, innermost frame first, that
calls ``backward()`` (or ``trainer.fit()`` / ``trainer.train()``) or a function of the script
that does, two calls deep (a student trained after its teacher, fine-tuning after pre-training,
``train()`` after ``warmup()``, a second task).
Once that frame's line has reached the statement at a step, the replay goes on for as many
updates as the step budget (a bug of the later phase, a missing ``zero_grad()``, needs two of
its steps), bounded then only by the seconds. A training loop around the step whose ``range``
has more passes left than the cap is not waited through (``cut`` "long").

A reached wait for the loop around the training loop also says that loop's count (``for epoch
in range(E)``, read as instrument/planned.py reads the loop around a DataLoader's) and how many
of its passes were done when the next began: the plan the schedules of such a script are judged
against (analysis/lr.py's ``hand_loop``).

Bounded: ``PHASE_UPDATES`` updates in all and ``PHASE_SECONDS`` seconds from the budget. When
a wait ends, one ``phase_hold`` aside says what it waited for (``wait``: "loop" | "switch" |
"evaluation" | "later"), the line of that loop, call or statement (``site``), ``updates`` at
the budget and at the end (``until``), and ``cut`` ("updates" | "seconds" | "long": the pass is
longer than the cap; None: reached). DataLoader epochs are left to the DataLoader watcher: only
a later phase is waited for there. Scripts that end before the budget, or whose step is in a
single loop with no evaluation in it and nothing training after it, run as before.
"""

from __future__ import annotations

import ast
import itertools
import sys
import time

import torch

from .. import events as ev
from ..trace import Location
from ..training_calls import CALL_DEPTH, block_of, functions_of, later_training_statements
from .planned import _count, _evaluate, _loops_around, _tree, _Unknown, _unwrapped
from .recorder import Recorder
from .stop import StepBudget
from .topics import BUDGET_HOLD

PHASE_UPDATES = 200  # the wait ends at this many updates in all
PHASE_SECONDS = 60.0  # ... or this many seconds after the budget was reached
_FRAMES = 8  # user frames on the step's stack whose loops are read
_MISSING = object()


def _length(value):
    """``len`` of a container or tensor (no code of the script runs), else None."""
    if isinstance(value, (torch.Tensor, list, tuple, range, dict, str)):
        return len(value)
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return len(value)
    return None


def _range_left(loop, frame) -> int | None:
    """How many more passes ``for v in range(...)`` (``loop``) makes after its current one,
    read from ``frame``'s values; None when unknown."""
    if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
        return None
    it = _unwrapped(loop.iter)
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("range", "trange")
            and 1 <= len(it.args) <= 3 and not it.keywords):
        return None
    try:
        args = [_evaluate(arg, frame, _length) for arg in it.args]
    except _Unknown:
        return None
    except Exception:
        return None
    if not all(type(a) is int for a in args):
        return None
    current = frame.f_locals.get(loop.target.id, _MISSING)
    values = range(*args)
    if type(current) is not int or current not in values:
        return None
    return len(values) - values.index(current) - 1


def _range_index(loop, frame) -> int | None:
    """The position of the current pass of ``for v in range(...)`` (0 for the first), read
    from ``frame``'s values; None when unknown."""
    left = _range_left(loop, frame)
    total = _count(loop, frame, _length)
    if left is None or total is None or total[0] != "epochs":
        return None
    index = total[1] - left - 1
    return index if index >= 0 else None


def _counter(loop, inner) -> str | None:
    """The name that tells the passes of ``loop`` apart: a ``for``'s variable (the first name
    of a tuple target), a ``while``'s name counted up in its body outside ``inner`` (the
    training loop, when it lies in the same function)."""
    if isinstance(loop, ast.For):
        target = loop.target
        if isinstance(target, ast.Tuple) and target.elts:
            target = target.elts[0]
        return target.id if isinstance(target, ast.Name) else None
    skip = set()
    if inner is not None:
        skip = {id(n) for n in ast.walk(inner)}
    for node in ast.walk(loop):
        if id(node) in skip:
            continue
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) \
                and isinstance(node.target, ast.Name):
            return node.target.id
    return None


def _eval_calls(node) -> list[int]:
    """Lines of ``x.eval()`` / ``x.train(False)`` calls under ``node``."""
    lines = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            if n.func.attr == "eval" and not n.args and not n.keywords:
                lines.append(n.lineno)
            elif n.func.attr == "train" and len(n.args) == 1 and isinstance(n.args[0], ast.Constant) \
                    and n.args[0].value is False:
                lines.append(n.lineno)
    return lines


def _evaluation_site(loop, tree) -> int | None:
    """The line in the training loop's body that calls ``.eval()``, or calls a function of the
    script that does (two calls deep); None when there is none."""
    functions = functions_of(tree)
    direct = _eval_calls(loop)
    if direct:
        return min(direct)
    frontier = [(loop, None)]
    seen: set[str] = set()
    for _ in range(CALL_DEPTH):
        nxt = []
        for node, site in frontier:
            for n in ast.walk(node):
                if not isinstance(n, ast.Call):
                    continue
                name = n.func.id if isinstance(n.func, ast.Name) else \
                    n.func.attr if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                    and n.func.value.id == "self" else None
                if name is None or name in seen or name not in functions:
                    continue
                seen.add(name)
                line = site if site is not None else n.lineno
                if _eval_calls(functions[name]):
                    return line
                nxt.append((functions[name], line))
        frontier = nxt
    return None


def _stage_switch(loop, frame, updates: int):
    """``(line, name, K)`` of an ``if n == K:`` / ``if n >= K:`` / ``if n > K:`` statement in
    the training loop's body (not in a loop nested in it), ``n`` the loop's counter (its ``for``
    variable, or a name its body counts up), its value now an int below ``K``, and ``K`` within
    the cap's updates from now; None otherwise."""
    names = set()
    if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name):
        names.add(loop.target.id)
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    if isinstance(loop, ast.While) and isinstance(loop.test, ast.Compare) and isinstance(loop.test.left, ast.Name):
        names.add(loop.test.left.id)
    if not names:
        return None
    todo = list(loop.body)
    while todo:
        stmt = todo.pop(0)
        if isinstance(stmt, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If):
            test = stmt.test
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
                    and test.left.id in names and isinstance(test.ops[0], (ast.Eq, ast.GtE, ast.Gt)):
                try:
                    k = _evaluate(test.comparators[0], frame, _length)
                except Exception:
                    k = None
                now = frame.f_locals.get(test.left.id, _MISSING)
                if type(k) is int and type(now) is int and now < k and updates + (k - now) < PHASE_UPDATES:
                    return stmt.lineno, test.left.id, k
            todo.extend(stmt.body)
            todo.extend(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.Try)):
            todo.extend(stmt.body)
    return None


def _later_phase(frames) -> tuple | None:
    """``(frame, line)`` of the first later statement that trains in the block of a script frame
    on the step's stack, innermost frame first: the statement after the one running (for a frame
    with loops, after its outermost loop) that calls ``backward()`` or a function of the script
    that does. A student trained after its teacher, fine-tuning after pre-training, ``train()``
    after ``warmup()``. None when the script shows no later phase."""
    for frame in frames:
        tree = _tree(frame.f_code.co_filename)
        if tree is None:
            return None
        loops = _loops_around(tree, frame.f_lineno)
        anchor = loops[0].lineno if loops else frame.f_lineno
        body = block_of(tree, anchor)
        if body:
            running = next((stmt for stmt in body
                            if stmt.lineno <= anchor <= (stmt.end_lineno or stmt.lineno)), None)
            end = (running.end_lineno or running.lineno) if running is not None else anchor
            later = later_training_statements(body, end, functions_of(tree))
            if later:
                return frame, later[0].lineno
        if frame.f_code.co_name == "<module>":
            break  # the script's own top level: the frames above it run the script
    return None


class _Wait:
    __slots__ = ("wait", "site", "frame", "name", "value", "budget", "deadline", "last_seq",
                 "planned", "passes", "entered", "then")

    def __init__(self, wait: str, site: Location, frame=None, name=None, value=None,
                 budget: int = 0, last_seq: int = -1, deadline: float | None = None,
                 planned=None, passes: int | None = None):
        self.wait, self.site, self.frame, self.name, self.value = wait, site, frame, name, value
        self.planned, self.passes = planned, passes
        self.budget = budget
        # PHASE_SECONDS from now, and never past the step budget's own (half the time limit)
        self.deadline = time.monotonic() + PHASE_SECONDS
        if deadline is not None:
            self.deadline = min(self.deadline, deadline)
        self.last_seq = last_seq
        self.entered: int | None = None  # "later": the update at which the later phase began
        self.then: _Wait | None = None  # the later phase, waited for once this wait is reached


class PhaseHold:
    """The ``budget_hold`` subscriber described above."""

    def __init__(self, rec: Recorder, dataloader):
        self.rec = rec
        self.dataloader = dataloader
        self._state: _Wait | bool | None = None  # None: not decided; False: nothing to wait for
        rec.subscribe(BUDGET_HOLD, self._hold)

    def install(self, patcher) -> None:  # patches nothing: it only reads the stack and the trace
        return None

    def _hold(self) -> bool:
        state = self._state
        if state is False:
            return False
        try:
            if state is None:
                state = self._state = self._decide()
                if state is False:
                    return False
            return self._waiting(state)
        except Exception as exc:  # the user's run goes on: the budget ends it as before
            self._state = False
            self.rec.internal_error("phase hold", exc)
            return False

    # -- at the budget ------------------------------------------------------------------
    def _decide(self):
        rec = self.rec
        if rec.progress.updates >= PHASE_UPDATES:
            return False
        frames = list(itertools.islice(rec.finder.user_frames(sys._getframe(1)), _FRAMES))
        later = _later_phase(frames) if frames else None
        then = None
        if later is not None and self._too_long(frames[0]):
            rec.emit_aside(ev.phase_hold(wait="later", updates=rec.progress.updates,
                                         until=rec.progress.updates, cut="long", cap=PHASE_UPDATES,
                                         cap_s=PHASE_SECONDS),
                           Location(rec.finder.location(later[0]).path, later[1]))
            later = None
        if later is not None:
            frame, line = later
            then = _Wait("later", Location(rec.finder.location(frame).path, line), frame,
                         value=line, budget=rec.progress.updates, deadline=self._deadline())
        # DataLoader epochs hold the budget themselves: only a later phase is waited for
        first = False if self.dataloader.trains() else self._first_wait(frames)
        if first is False:
            return then if then is not None else False
        first.then = then
        return first

    def _too_long(self, frame) -> bool:
        """The training loop around the step (``for i in range(N)``) has more passes left than
        the cap allows: a later phase could not be reached within it."""
        tree = _tree(frame.f_code.co_filename)
        loops = _loops_around(tree, frame.f_lineno) if tree is not None else []
        left = _range_left(loops[-1], frame) if loops else None
        return left is not None and self.rec.progress.updates + left >= PHASE_UPDATES

    def _first_wait(self, user_frames):
        """The wait within the running phase (the loop's next pass, a stage switch, the first
        evaluation), else False."""
        rec = self.rec
        chain = []  # (frame, loop, tree), innermost first
        for frame in user_frames:
            tree = _tree(frame.f_code.co_filename)
            if tree is None:
                break
            for loop in reversed(_loops_around(tree, frame.f_lineno)):
                chain.append((frame, loop, tree))
            if frame.f_code.co_name == "<module>":
                break  # the script's own top level: the frames above it run the script
        if not chain:
            return False
        frame, loop, tree = chain[0]
        path = rec.finder.location(frame).path
        budget = rec.progress.updates
        left = _range_left(loop, frame)
        if len(chain) >= 2 and (left is None or budget + left < PHASE_UPDATES):
            outer_frame, outer, _ = chain[1]
            name = _counter(outer, loop if outer_frame is frame else None)
            if _range_left(outer, outer_frame) == 0:
                name = None  # its last pass: no next one to wait for (what follows the loop is not)
            if name is not None:
                value = outer_frame.f_locals.get(name, _MISSING)
                if value is not _MISSING:
                    site = Location(rec.finder.location(outer_frame).path, outer.lineno)
                    # the run's plan for the schedules (analysis/lr.py): the loop's count, and
                    # how many passes are done once the next one begins (all of equal length)
                    index = _range_index(outer, outer_frame)
                    return _Wait("loop", site, outer_frame, name, value, budget,
                                 deadline=self._deadline(),
                                 planned=_count(outer, outer_frame, _length),
                                 passes=index + 1 if index is not None else None)
        switch = _stage_switch(loop, frame, budget)
        if switch is not None:  # ``if step == K:`` in the training loop, K ahead within the cap
            line, name, k = switch
            return _Wait("switch", Location(path, line), frame, name, k, budget,
                         deadline=self._deadline())
        line = _evaluation_site(loop, tree)
        if line is None:
            if len(chain) >= 2 and left is not None and budget + left >= PHASE_UPDATES:  # too long: say so
                outer_frame, outer, _ = chain[1]
                rec.emit_aside(ev.phase_hold(wait="loop", updates=budget, until=budget, cut="long",
                                             cap=PHASE_UPDATES, cap_s=PHASE_SECONDS),
                               Location(rec.finder.location(outer_frame).path, outer.lineno))
            return False
        if self._evaluated():
            return False  # evaluated since the first step already: its effects were seen
        events = rec.trace.events
        return _Wait("evaluation", Location(path, line), budget=budget,
                     last_seq=events[-1].seq if events else -1, deadline=self._deadline())

    def _deadline(self) -> float | None:
        """The step budget's own deadline (half the time limit from the start), if any."""
        for condition in self.rec.progress.stop_conditions:
            deadline = getattr(condition, "deadline", None)
            if isinstance(condition, StepBudget) and deadline is not None:
                return deadline
        return None

    def _evaluated(self) -> bool:
        stepped = False
        for e in self.rec.trace.events:
            if e.kind == "step":
                stepped = True
            elif stepped and _evaluates(e):
                return True
        return False

    # -- after each step past the budget ------------------------------------------------
    def _waiting(self, state: _Wait) -> bool:
        rec = self.rec
        updates = rec.progress.updates
        cut = None
        if state.wait == "loop":
            reached = state.frame.f_locals.get(state.name, _MISSING) is not state.value
        elif state.wait == "switch":  # the counter went past K: the switch ran, an update followed
            now = state.frame.f_locals.get(state.name, _MISSING)
            reached = type(now) is not int or now > state.value
        elif state.wait == "later":  # the later phase has begun: as many updates of it as the budget
            if state.entered is None and state.frame.f_lineno >= state.value:
                state.entered = updates - 1  # this step was the later phase's first
            reached = state.entered is not None and updates - state.entered >= state.budget
        else:
            reached = self._new_evaluation(state)
        if not reached:
            if state.entered is not None:  # within the later phase: only the time limit ends it
                if time.monotonic() <= state.deadline:
                    return True
                cut = "seconds"
            elif updates >= PHASE_UPDATES:
                cut = "updates"
            elif time.monotonic() > state.deadline:
                cut = "seconds"
            else:
                return True
        then = state.then if cut is None else None
        self._state = then if then is not None else False
        state.frame = state.value = state.then = None
        rec.emit_aside(ev.phase_hold(wait=state.wait, updates=state.budget, until=updates, cut=cut,
                                     cap=PHASE_UPDATES, cap_s=PHASE_SECONDS,
                                     planned=state.planned if cut is None else None,
                                     passes=state.passes if cut is None else None),
                       state.site)
        if then is not None:  # the running phase's wait is over: on to the later phase
            return self._waiting(then)
        return False

    def _new_evaluation(self, state: _Wait) -> bool:
        events = self.rec.trace.events
        last = state.last_seq
        i = len(events) - 1
        found = False
        while i >= 0 and events[i].seq > last:
            if _evaluates(events[i]):
                found = True
            i -= 1
        if events:
            state.last_seq = events[-1].seq
        return found


def _evaluates(e) -> bool:
    """An evaluation's mark: ``model.eval()``, or a no-grad forward of a model in eval mode."""
    if e.kind == "eval":
        return True
    return (e.kind == "mode_forward" and not e["training"] and not e["grad"]
            and not e.get("nested") and not e.get("recalibrating"))
