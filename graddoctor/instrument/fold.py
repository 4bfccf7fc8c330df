"""Folding repeated turns: the recorder's trace stays bounded on an unbounded run.

A long run (``--steps 0``, hours of a real job) repeats the same turn of the loop over and over:
``zero_grad → backward → step`` with the same parameters, the same flags, only the numbers
(gradient norms, the loss scale, the batch index) changing. Kept whole, the trace grows by a few
KB per step. The folder keeps:

* every turn of the first ``FOLD_AFTER`` turns (short runs, the default step budget: nothing is
  ever folded, the trace is exactly what was recorded);
* then the first ``KEEP`` turns of each *shape* (the turn's events with the values listed in
  ``signature`` left out), each *deviating* turn (a shape seen fewer than ``KEEP`` times: a NaN,
  a new call, a validation pass), with the ``CONTEXT`` turns before and after each kept turn,
  and the last ``CONTEXT`` turns of the run;
* every other turn is *folded*: its events leave the list, and a ``folded`` event at that place
  says how many turns, steps, backwards and events went, and of which kept turn each folded one
  was a copy (``copies``: the kept turn's first and last seq, how many times). Events keep the
  seq they were recorded with, so seqs skip what was folded.

A turn here is the events from just after one ``step`` event to the next ``step`` event
included. Memory is then bounded by the number of distinct shapes (a run whose every turn is new,
such as an autograd graph that grows each step, keeps every turn: nothing to fold).

The analysis reads the ``folded`` events: step numbers count the folded steps, and
``Analysis.weight(event)`` is 1 + the number of folded copies of that event, for rules that
count occurrences. ``--trace`` writes the final trace, folded events included.
"""

from __future__ import annotations

from collections import deque
from types import MappingProxyType

from .. import events as ev
from ..events import ABSORBS, CALL_LABELS, NOT_CALLS, is_per_forward
from ..trace import Event, Trace

FOLD_AFTER = 512  # optimizer steps recorded whole before any folding (the default replay: far fewer)
KEEP = 2  # copies of a repeated block of turns kept whole before later copies fold
CONTEXT = 2  # turns after a folded block that must repeat too (the turns before a change stay)
MAX_PERIOD = 40  # longest block of turns that repeats (an epoch of the replay is 17 batches)
MAX_SHAPES = 4096  # distinct turn shapes remembered; a turn of any other shape is never folded


def _frozen(value):
    """A hashable copy of an event value (lists become tuples, recursively)."""
    if type(value) is list or type(value) is tuple:
        return tuple(_frozen(v) for v in value)
    if type(value) is dict:
        return tuple((k, _frozen(v)) for k, v in value.items())
    if type(value) is float and value != value:
        return "nan"  # NaN equals no NaN: a turn holding one would never repeat
    return value


_SPECIAL = frozenset({"norms", "total_norm", "epoch", "scale", "batch", "lrs"})


def signature(events: list[Event], deep: bool = False) -> tuple:
    """What makes two turns the same for the rules: every event's kind, location and data,
    except numbers that change from step to step while the loop does the same thing:

    * ``step_begin.norms`` and ``clip.total_norm`` (gradient norms; ``nonfinite`` is kept, and
      the last turns of a run, read by ``--grad-flow``, are always kept),
    * the loss scale of ``backward``, ``unscale`` and ``scaler_update`` (only whether there is
      one: the value may not have been read from the device yet),
    * the learning rates (``lrs``) a step reads and a scheduler step writes: a per-batch
      schedule changes them every turn (the rules judge schedules by counts and the
      schedulers' own arguments, which folding keeps; the lr timeline holds the kept steps),
    * ``epoch_start.epoch``, and the ``batch`` of each backward relative to the turn's first one
      (same batch, next batch, across an epoch boundary are kept; not which epoch or index).

    Lists become tuples (``deep``: nested ones too; the fast path leaves them, and a shape that
    holds one is then unhashable: ``Folder`` asks again with ``deep``).
    """
    out = []
    base = None  # the turn's first batch: [loader, epoch, index]
    for e in events:
        kind = e.kind
        items = []
        append = items.append
        for key, value in e.data.items():
            if key in _SPECIAL:
                if key == "scale":
                    value = None if value is None else "scale"
                elif key == "batch":
                    if value is not None:
                        if base is None:
                            base = value
                        try:
                            value = (value[0] == base[0], value[0], value[1] - base[1],
                                     value[2] - base[2])
                        except (TypeError, IndexError):
                            value = _frozen(value)
                elif (key == "norms" and kind == "step_begin") or (key == "total_norm" and kind == "clip") \
                        or (key == "epoch" and kind == "epoch_start") or key == "lrs":
                    continue
                else:
                    value = _frozen(value)
            else:
                t = type(value)
                if t is list:
                    value = _frozen(value) if deep else tuple(value)
                elif t is dict:
                    value = _frozen(value)
                elif t is float and value != value:
                    value = "nan"  # NaN equals no NaN: a turn holding one would never repeat
            append((key, value))
        out.append((kind, e.loc, tuple(items)))
    return tuple(out)


# the turns of the loop as analysis/turns.py cuts them, decided while recording (the same
# vocabulary: events.CALL_LABELS, NOT_CALLS, ABSORBS)
def _label(kind: str, loc) -> str | None:
    if loc is None:
        return None
    label = _LABELS.get(kind, _UNSEEN)
    if label is _UNSEEN:
        label = _LABELS[kind] = None if kind in NOT_CALLS or is_per_forward(kind) else CALL_LABELS.get(kind, kind)
    return label


_UNSEEN = object()
_LABELS: dict[str, str | None] = {}  # kind -> its label (None: not a call), filled as seen


def _same_call(a: str, b: str) -> bool:
    return b in ABSORBS.get(a, ()) or a in ABSORBS.get(b, ())


class Folder:
    """Watches the recorder's trace turn by turn and folds repeated turns out of it (see the
    module docs). ``observe`` before each event goes in; ``close`` at the end of the run;
    ``marker`` for a snapshot taken while a fold is open.

    The turns: as the report's timeline cuts them (analysis/turns.py), a turn ends after its
    optimizer step at the first call that starts the loop's next pass. Each closed turn gets a
    shape id. A block of ``p`` turns (``p`` up to ``MAX_PERIOD``: one turn, or a GAN's two, or
    a short epoch) at the front of the undecided turns is folded when the ``KEEP`` blocks before
    it and the ``CONTEXT`` turns after it repeat with the same period: what remains is the same
    sequence with whole periods taken out, so every turn the rules see next to another one was
    next to it in the run. The undecided turns (at most ``2 * MAX_PERIOD + CONTEXT``) stay in
    the trace; the oldest is kept when no block can fold.
    """

    def __init__(self, trace: Trace, fold_after: int | None = None, keep: int | None = None,
                 context: int | None = None, max_period: int | None = None):
        self.trace = trace
        self.fold_after = FOLD_AFTER if fold_after is None else fold_after
        self.keep = max(1, KEEP if keep is None else keep)
        self.context = max(0, CONTEXT if context is None else context)
        self.max_period = max(1, MAX_PERIOD if max_period is None else max_period)
        self.steps = 0
        self.active = self.fold_after <= 0
        # the open turn
        self.start = 0  # index in trace.events where it begins
        self.applied = False  # it has reached an optimizer step
        self.prev: tuple | None = None  # (label, path, line) of its latest call
        self.seen: set = set()
        # closed turns
        self.ids: dict[tuple, int] = {}  # shape -> id
        self.unique = -1  # ids of shapes not remembered (never equal to another)
        self.pending: list[list] = []  # undecided: [start, end, id]
        self.recent: deque = deque(maxlen=(self.keep + 1) * self.max_period + self.context)
        self.last_kept: dict[int, tuple[int, int]] = {}  # id -> (first, last seq) of its latest kept turn
        self.run: dict | None = None  # the fold in progress: where, and what went
        self._failed = 0  # periods 1.._failed do not repeat at the current front
        self.folded_turns = 0  # in all (tests and benchmarks)

    # -- recording ---------------------------------------------------------------------------
    def observe(self, kind: str, loc) -> None:
        """An event of this kind and location is about to go into the trace (before any held
        event is released): close the open turn if it starts the loop's next pass."""
        if not self.active:
            if kind == "step":
                self.steps += 1
                if self.steps >= self.fold_after:  # the next event opens the first turn watched
                    self.active = True
                    self.start = len(self.trace.events)
            return
        if loc is None:
            return
        label = _LABELS.get(kind, _UNSEEN)  # _label, inlined: every event of a folding run
        if label is _UNSEEN:
            label = _label(kind, loc)
        if label is None:
            return
        key = (label, loc.path, loc.line)
        prev = self.prev
        if prev is not None and prev[1] == key[1] and prev[2] == key[2] and _same_call(prev[0], label):
            self.applied = self.applied or kind in ("step", "scaler_step")
            return  # one call (scaler.step runs unscale_ and step at its line)
        if self.applied and prev is not None and (
                (prev[1] == key[1] and key[2] < prev[2]) or key in self.seen):
            self._close_turn()
        self.prev = key
        self.seen.add(key)
        if kind in ("step", "scaler_step"):
            self.applied = True

    def _close_turn(self) -> None:
        events = self.trace.events
        start, end = self.start, len(events)
        self.start, self.applied, self.prev, self.seen = end, False, None, set()
        if end <= start:
            return
        turn = events[start:end]
        shape = signature(turn)
        ids = self.ids
        try:
            turn_id = ids.get(shape)
        except TypeError:  # a nested list (frozen params, a graph's history): frozen deeply
            shape = signature(turn, deep=True)
            turn_id = ids.get(shape)
        if turn_id is None:
            if len(ids) < MAX_SHAPES:
                turn_id = ids[shape] = len(ids)
            else:
                turn_id, self.unique = self.unique, self.unique - 1
        self.pending.append([start, end, turn_id])
        self._decide()

    def _decide(self) -> None:
        pending, recent = self.pending, self.recent
        while pending:
            period = self._period()
            if period:
                self._fold(period)
            elif len(pending) > 2 * self.max_period + self.context:
                start, end, turn_id = pending.pop(0)
                self._failed = 0  # a new front
                self._kept(turn_id, start, end)
            else:
                return

    def _period(self) -> int:
        """The smallest period p such that the ``KEEP`` blocks of p decided turns before the
        front of the undecided ones, a block of p at that front and the ``CONTEXT`` turns after
        it all repeat with period p (0: none yet). The periods already found not to repeat for
        this front are not tried again (``_failed``)."""
        recent, pending, keep, context = self.recent, self.pending, self.keep, self.context
        front = len(recent)
        for p in range(self._failed + 1, self.max_period + 1):
            if len(pending) < p + context or front < keep * p:
                return 0  # not enough turns to tell yet
            # the ids from the first decided turn compared (front - keep * p) to the last turn
            # of the context after the block: each equals the one p turns before it
            ids = [recent[j] for j in range(front - keep * p, front)]
            ids.extend([t[2] for t in pending[:p + context]])
            if ids[p:] == ids[:-p]:
                return p
            self._failed = p
        return 0

    def _kept(self, turn_id: int, start: int, end: int) -> None:
        if self.close():  # a kept turn ends the fold in progress: its folded event goes before
            start, end = start + 1, end + 1
        events = self.trace.events
        self.last_kept[turn_id] = (events[start].seq, events[end - 1].seq)
        self.recent.append(turn_id)

    def _fold(self, period: int) -> None:
        events = self.trace.events
        block = self.pending[:period]
        del self.pending[:period]
        self._failed = 0  # a new front
        start, end = block[0][0], block[-1][1]
        turns = events[start:end]
        del events[start:end]
        removed = end - start
        for entry in self.pending:
            entry[0] -= removed
            entry[1] -= removed
        self.start -= removed
        run = self.run
        if run is None:
            run = self.run = {"index": start, "seq": turns[0].seq, "turns": 0, "steps": 0,
                              "backwards": 0, "events": 0, "epochs": 0, "copies": {}}
        run["turns"] += period
        run["events"] += removed
        for e in turns:
            if e.kind == "step":
                run["steps"] += 1
            elif e.kind == "backward":
                run["backwards"] += 1
            elif e.kind == "epoch_start":
                run["epochs"] += 1
        copies = run["copies"]
        for _, _, turn_id in block:
            rep = self.last_kept[turn_id]
            copies[rep] = copies.get(rep, 0) + 1
            self.recent.append(turn_id)
        self.folded_turns += period
    # -- the folded event --------------------------------------------------------------------
    def marker(self) -> tuple[int, Event] | None:
        """The ``folded`` event of the fold in progress and the index it goes at, or None."""
        run = self.run
        if run is None:
            return None
        kind, data = ev.folded(turns=run["turns"], steps=run["steps"], backwards=run["backwards"],
                               events=run["events"], epochs=run["epochs"],
                               copies=[[first, last, n] for (first, last), n in run["copies"].items()])
        return run["index"], Event(run["seq"], kind, None, MappingProxyType(data))

    def close(self) -> bool:
        """End the fold in progress: its ``folded`` event goes into the trace where it was."""
        made = self.marker()
        if made is None:
            return False
        index, event = made
        self.run = None
        self.trace.events.insert(index, event)
        for entry in self.pending:
            entry[0] += 1
            entry[1] += 1
        self.start += 1
        return True

    def finish(self) -> None:
        """The end of the run: the fold in progress ends; the undecided turns are kept."""
        self.close()
        self.pending.clear()
