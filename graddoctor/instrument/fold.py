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

In the steady state of a long run (``STEADY_AFTER`` turns in a row that each repeated the one
before) the events of the next turns are kept aside instead (``Folder.steady_put``), each checked
against the turn before, and put where recording them would have put them as soon as one
deviates or the trace is needed (``Folder.materialize``): the trace is the same either way.

The analysis reads the ``folded`` events: step numbers count the folded steps, and
``Analysis.weight(event)`` is 1 + the number of folded copies of that event, for rules that
count occurrences. ``--trace`` writes the final trace, folded events included.
"""

from __future__ import annotations

import operator
from collections import deque
from itertools import islice, repeat
from operator import attrgetter, is_, is_not, itemgetter
from types import MappingProxyType

from .. import events as ev
from ..events import ABSORBS, CALL_LABELS, NOT_CALLS, is_per_forward
from ..trace import Event, Trace, made_event

# ``operator.call`` is new in Python 3.11
call = getattr(operator, "call", None) or (lambda function, argument: function(argument))

FOLD_AFTER = 512  # optimizer steps recorded whole before any folding (the default replay: far fewer)
KEEP = 2  # copies of a repeated block of turns kept whole before later copies fold
CONTEXT = 2  # turns after a folded block that must repeat too (the turns before a change stay)
MAX_PERIOD = 40  # longest block of turns that repeats (an epoch of the replay is 17 batches)
MAX_SHAPES = 4096  # distinct turn shapes remembered; a turn of any other shape is never folded
# and the values those shapes hold in all (each list value counts its length): a routed loop (a
# mixture of experts) makes a new shape every turn, each holding the pids of the experts it
# routed, thousands at thousands of tensors; remembered up to MAX_SHAPES, they grew the process
# by ~50 KB a turn at 1,000 tensors (its turns never fold: no shape of it recurs). The first
# MIN_SHAPES are remembered whatever they hold: a loop over tens of thousands of tensors holds
# ~100,000 values a turn, and the few shapes of its first turns (before the one it repeats) must
# not use the budget up before its steady shape comes
MAX_SHAPE_VALUES = 1 << 20
MIN_SHAPES = 64
# turns in a row that repeated the one before and folded at once (period 1) before the steady
# path takes the next ones (``Folder.steady_put``): far past any fixture, past the first steps
STEADY_AFTER = 256
# the hooks of a steady turn take their straight-line paths (``Folder.steady_take``); False: every
# event of the steady state goes through ``Folder.steady_put`` (the tests compare the two)
STEADY_HOOKS = True
# the skim of a long steady state: once it has lasted ``SKIM_AFTER`` turns (a run reaches it after
# FOLD_AFTER + STEADY_AFTER + SKIM_AFTER turns, about 1,030: far past every fixture, none longer
# than 240 steps, and the default replay), the hooks of a turn read only what tells its shape (the
# same optimizer, thread, arguments, call sites, kinds in order) and take their events as the
# armed ones; about one turn in ``SKIM_EVERY``, at gaps that vary (``SampleSchedule``), is
# *sampled*: its hooks take their full straight-line paths (the grads' reads, the norm pass, the
# loss describers). False: no skim (the tests compare).
SKIM = True
SKIM_AFTER = 256
SKIM_EVERY = 16
# Once a steady state has lasted SKIM_LONGER turns at one gap, its samples thin out: the gap
# doubles, up to SKIM_EVERY_MAX (1 in 16 up to its 2,048th turn, 1 in 32 up to its 4,096th, 1 in
# 64 from then on). A sampled turn reads ~3.5 times a skimmed turn's Python (the grads, the norm
# pass, the loss describers): at 1 in 16 a sixth of a long run's cost per turn. What a sample
# reads is found later the longer the gap: a NaN gradient at most SKIM_EVERY_MAX +
# SKIM_EVERY_MAX // 8 - 1 turns late (71), a deviation that only the reads show certain to be read
# if it lasts 72 turns (docs/performance.md); what changes a turn's shape is found on any turn.
SKIM_EVERY_MAX = 64
SKIM_LONGER = 2048
# The three starts above (FOLD_AFTER, STEADY_AFTER, SKIM_AFTER) count turns, but what a turn's
# full reads cost grows with the tensors the optimizers own: a 30,000-tensor model pays a hundred
# times what a 300-tensor one does per turn. Past ``WORK_REFERENCE`` owned tensors each start is
# scaled by WORK_REFERENCE / owned, so that the work read in full before the skim stays about
# what a model of that size reads, never below its floor (``FOLD_FLOOR``: longer than the default
# replay of a DataLoader script, 35 updates; the steady path and the skim then still wait
# ``STEADY_FLOOR`` and ``SKIM_FLOOR`` turns of full reads each): a model of thousands of tensors
# skims from its ninetieth turn or so, a small one (every fixture) as before.
WORK_REFERENCE = 64
FOLD_FLOOR = 48
STEADY_FLOOR = 16
SKIM_FLOOR = 16


def scaled_start(constant: int, floor: int, owned: int) -> int:
    """A start of ``constant`` turns for a model whose optimizers own ``owned`` tensors: as it
    is up to ``WORK_REFERENCE`` of them, then shorter in proportion, down to ``floor`` (a
    constant below its floor, as the tests set them, is kept)."""
    if owned <= WORK_REFERENCE:
        return constant
    return max(min(constant, floor), constant * WORK_REFERENCE // owned)


class SampleSchedule:
    """Which turns of a steady state the skim samples: about one in ``every``, the gap between
    two samples ``every`` give or take ``every // 8`` (at least 1), drawn from a fixed integer
    hash of the sample's number (no random number generator is touched). Every gap varies, so
    the sampled turns fall on every residue of any period over a long run: a deviation that
    repeats every 2nd, 16th or 32nd turn lands on sampled turns too (with samples exactly every
    ``every`` turns, one repeating with a multiple of ``every`` on another turn was never read),
    and two samples are never more than ``every + every // 8`` turns apart. Asked about turns in
    increasing order (``Folder.skimming``).

    ``longest`` and ``longer``: once the samples have covered ``longer`` turns at one ``every``,
    it doubles, up to ``longest`` (``lasted``: turns the steady states a snapshot ended just
    before this one had lasted, counted as this one's: a provisional report does not bring the
    dense samples back)."""

    __slots__ = ("every", "spread", "next", "count", "longest", "longer", "since")

    def __init__(self, every: int, longest: int | None = None, longer: int | None = None,
                 lasted: int = 0):
        self.every = every
        self.spread = max(1, every // 8)
        self.next = 0  # the next sampled turn
        self.count = 0  # samples placed so far
        self.longest = every if longest is None or not longer else max(every, longest)
        self.longer = longer
        self.since = -lasted  # the turn the current ``every`` began at

    def sampled(self, turn: int) -> bool:
        while self.next < turn:
            self.count += 1
            if self.every < self.longest and self.next - self.since >= self.longer:
                while self.every < self.longest and self.next - self.since >= self.longer:
                    self.every = min(self.longest, 2 * self.every)
                    self.since += self.longer
                self.spread = max(1, self.every // 8)
            drawn = ((self.count * 2654435761) & 0xFFFFFFFF) >> 16
            self.next += max(1, self.every - self.spread + drawn % (2 * self.spread + 1))
        return self.next == turn


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


# The fast path of ``Folder``: a new turn compared with the turn whose shape is the one it is
# expected to repeat, event by event, without building its signature. ``_plan`` prepares the
# comparison once per shape (from the turn its ``ids`` key was made from); ``_repeats`` answers
# True only when ``signature`` of the new turn would equal that key, so the shape id is the
# same. A turn with a value that is neither plain (``_plain``) nor a dict, a NaN or one that
# ``signature`` changes gets no plan: its turns always take ``signature``.
_SCALE, _BATCH, _FROZEN = range(3)
_PLAIN = frozenset({type(None), bool, int, str, float})
_PLAIN_NOT_FLOAT = frozenset({type(None), bool, int, str})


def _plain(value) -> bool:
    """None, bool, int, str, a float but NaN, or a list of those or of such lists: compared
    with ``==`` it equals only what ``signature`` makes equal to it (a NaN equals a NaN there,
    a dict's keys are in order, a tuple equals a list), deep or not."""
    t = type(value)
    if t is float:
        return value == value
    if t is list:
        # a list of pids (a mixture of experts' turn: thousands, a new list each turn) in one
        # pass in C; floats (a NaN) and nested lists element by element
        return set(map(type, value)) <= _PLAIN_NOT_FLOAT or all(map(_plain, value))
    return t in _PLAIN


def _weight(shape: tuple) -> int:
    """How many values a turn's ``signature`` holds, each list (a tuple there) counting its length:
    what remembering the shape costs, and its plan with it (at least 1)."""
    weight = len(shape)
    for _kind, _loc, items in shape:
        weight += len(items)
        for _key, value in items:
            if type(value) is tuple:
                weight += len(value)
    return weight


def _batch(value, base):
    """``signature``'s value for a ``batch`` (``base``: the turn's first one)."""
    try:
        return (value[0] == base[0], value[0], value[1] - base[1], value[2] - base[2])
    except (TypeError, IndexError):
        return _frozen(value)


def _plan(events: list[Event]) -> tuple | None:
    """What ``_repeats`` compares a turn with: its events' kinds and locations, their data's
    keys in order, a getter per event of the values compared as they are (``len`` when there
    are none) and those values, and the other values as ``signature`` makes them: (the event's
    index, the key, how, the value). None: this turn's shape gets no fast path."""
    getters, special = [], []
    base = None
    for i, e in enumerate(events):
        kind, data = e.kind, e.data
        plain = []
        for key, value in data.items():
            if key in _SPECIAL:
                if key == "scale":
                    special.append((i, key, _SCALE, None if value is None else "scale"))
                elif key == "batch":
                    if value is not None:
                        if base is None:
                            base = value
                        value = _batch(value, base)
                        if type(value) is not tuple or not all(_plain(v) for v in value):
                            return None
                    special.append((i, key, _BATCH, value))
                elif (key == "norms" and kind == "step_begin") or (key == "total_norm" and kind == "clip") \
                        or (key == "epoch" and kind == "epoch_start") or key == "lrs":
                    continue  # left out (the keys, in order, are compared)
                else:
                    special.append((i, key, _FROZEN, _frozen(value)))
            elif _plain(value):
                plain.append(key)
            elif type(value) is dict or type(value) is float:  # a dict, a NaN: as signature has them
                special.append((i, key, _FROZEN, _frozen(value)))
            else:
                return None  # a tuple, a dict in a list, any other object: signature decides
        getters.append(itemgetter(*plain) if plain else len)
    datas = [e.data for e in events]
    return ([(e.kind, e.loc) for e in events], [tuple(d) for d in datas], getters,
            list(map(call, getters, datas)), tuple(special))


_third = itemgetter(2)  # a pending turn's id
_head = attrgetter("kind", "loc")
_data = attrgetter("data")


def _repeats(events: list[Event], plan: tuple) -> bool:
    """Whether ``signature(events)`` equals the signature of the turn ``plan`` was made from.
    Stricter where that is cheap: the data's keys must be the same, in the same order. Most of
    it compares lists that C functions made (the fast path of every turn of a long run)."""
    heads, keys, getters, values, special = plan
    if list(map(_head, events)) != heads:  # their number, kinds and locations
        return False
    datas = list(map(_data, events))
    if list(map(tuple, datas)) != keys or values != list(map(call, getters, datas)):
        return False
    base = None  # the new turn's first batch
    for i, key, how, expected in special:
        value = datas[i][key]
        if how == _SCALE:
            value = None if value is None else "scale"
        elif how == _BATCH:
            if value is not None:
                if base is None:
                    base = value
                value = _batch(value, base)
        else:
            value = _frozen(value)
        if not (expected == value):
            return False
    return True


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


_DATA = frozenset({type(None), bool, int, float, str})


def plain_data(value) -> bool:
    """None, a bool, int, float or str, or a list, tuple or str-keyed dict of such values: what
    ``exact`` compares."""
    t = type(value)
    if t in _DATA:
        return True
    if t is list or t is tuple:
        return all(map(plain_data, value))
    if t is dict:
        return all(type(k) is str for k in value) and all(map(plain_data, value.values()))
    return False


def exact(a, b) -> bool:
    """``a == b`` where JSON would write them the same, for ``b`` plain data (``plain_data``):
    the same types all the way down (1 is not 1.0, not True), dict keys in the same order, -0.0
    not 0.0 (``repr`` tells them all apart; ``==`` keeps an object whose repr could pass for
    plain data from matching). What a straight-line hook compares its reads with."""
    return type(a) is type(b) and a == b and repr(a) == repr(b)


def _copied(value):
    """A list (nested ones too) copied: the data of an event made from an armed one's."""
    return [_copied(v) for v in value] if type(value) is list else value


def _realize(turn: list) -> None:
    """The unmade events of a turn (``Folder.steady_take``'s tuples) made, in place: the data
    of the armed event with the turn's own values, its lists copied."""
    for i, entry in enumerate(turn):
        if type(entry) is tuple:
            seq, kind, loc, base, changes = entry
            data = {key: _copied(value) for key, value in base.items()}
            if changes:
                data.update(changes)
            turn[i] = Event(seq, kind, loc, MappingProxyType(data))


def _turn_repeats(turn: list, plan: tuple) -> bool:
    """``_repeats`` of a steady turn: its unmade events repeat by construction (each hook
    compared what it read with what it read when armed); a turn with events made the usual
    way compares those only (``_made_repeat``), the unmade ones left unmade (a clip or a
    step after one, made every turn, no longer has every list of the turn copied per turn)."""
    if all(map(is_, map(type, turn), repeat(tuple))):
        return True
    if all(map(is_not, map(type, turn), repeat(tuple))):
        return _repeats(turn, plan)
    return _made_repeat(turn, plan)


def _made_repeat(turn: list, plan: tuple) -> bool:
    """``_repeats`` for a turn of made events and unmade ones (``steady_take``'s tuples): the
    made events compared as ``_repeats`` compares them; an unmade one only lends its ``batch``
    (``_repeats`` reads every batch relative to the turn's first)."""
    heads, keys, getters, values, special = plan
    if len(turn) != len(heads):
        return False
    for i, entry in enumerate(turn):
        if type(entry) is tuple:
            continue
        data = entry.data
        if (entry.kind, entry.loc) != heads[i] or tuple(data) != keys[i] \
                or getters[i](data) != values[i]:
            return False
    base = None
    for i, key, how, expected in special:
        entry = turn[i]
        if type(entry) is tuple:  # repeats by construction; its batch is the base if first
            if how == _BATCH and base is None:
                changes = entry[4]
                value = changes[key] if changes and key in changes else entry[3][key]
                if value is not None:
                    base = value
            continue
        value = entry.data[key]
        if how == _SCALE:
            value = None if value is None else "scale"
        elif how == _BATCH:
            if value is not None:
                if base is None:
                    base = value
                value = _batch(value, base)
        else:
            value = _frozen(value)
        if not (expected == value):
            return False
    return True


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

    In the steady state of a long run a turn costs a few list comparisons: it is compared
    with the turn one period back (``_repeats``; its ``signature`` only when that fails), and
    while the turns keep repeating with the latest fold's period the next block folds without
    the period test (``streak``). The undecided turns' indices are kept ahead by ``shift``, so a
    fold moves none of them, and a fold counts its turns per shape id.
    """

    def __init__(self, trace: Trace, fold_after: int | None = None, keep: int | None = None,
                 context: int | None = None, max_period: int | None = None,
                 steady_after: int | None = None):
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
        self.shape_values = 0  # what the remembered shapes hold (_weight): MAX_SHAPE_VALUES at most
        # beyond the first MIN_SHAPES
        self.pending: list[list] = []  # undecided: [start, end, id], start and end + shift
        self.shift = 0  # what the pending turns' starts and ends are ahead of their index now
        self.plans: dict[int, tuple | None] = {}  # id -> the fast comparison with its shape
        self.counts: dict[int, tuple[int, int, int]] = {}  # id -> its steps, backwards, epochs
        self.hint = 1  # the period of the latest fold: a turn repeats the one that far back
        # p > 0: the latest fold's period, while the decided turns of its test and every turn
        # closed since repeat with period p (see _period)
        self.streak = 0
        self.recent: deque = deque(maxlen=(self.keep + 1) * self.max_period + self.context)
        self.last_kept: dict[int, tuple[int, int]] = {}  # id -> (first, last seq) of its latest kept turn
        self.run: dict | None = None  # the fold in progress: where, and what went
        self._failed = 0  # periods 1.._failed do not repeat at the current front
        self.folded_turns = 0  # in all (tests and benchmarks)
        # the steady path (``steady_put``): turns in a row that repeated the one before and
        # folded at once; the steady state once that many did (None: not in it)
        self.steady_after = STEADY_AFTER if steady_after is None else steady_after
        self.in_row = 0
        self.steady: _Steady | None = None
        # (turn id, turns on the steady path so far) of a steady state a snapshot ended, until
        # the next turn takes it up again or breaks the row
        self._resumable: tuple[int, int] | None = None
        self.steady_hooks = STEADY_HOOKS
        self.skim_after = SKIM_AFTER if SKIM and STEADY_HOOKS else None
        self.skim_every = SKIM_EVERY
        # how many tensors the optimizers own now (the recorder's), read before the folding
        # starts: the starts scale with it (``scaled_start``); None, or starts given to the
        # constructor: the constants as they are
        self.owned = None
        self._scales = fold_after is None and steady_after is None

    # -- recording ---------------------------------------------------------------------------
    def observe(self, kind: str, loc) -> None:
        """An event of this kind and location is about to go into the trace (before any held
        event is released): close the open turn if it starts the loop's next pass."""
        if not self.active:
            if kind == "step":
                self.steps += 1
                steps = self.steps
                if steps >= self.fold_after or (
                        steps >= FOLD_FLOOR and self.owned is not None and self._scales
                        and steps >= scaled_start(self.fold_after, FOLD_FLOOR, self.owned())):
                    self.active = True  # the next event opens the first turn watched
                    self.start = len(self.trace.events)
                    if self.owned is not None and self._scales:
                        owned = self.owned()
                        self.steady_after = scaled_start(self.steady_after, STEADY_FLOOR, owned)
                        if self.skim_after is not None:
                            self.skim_after = scaled_start(self.skim_after, SKIM_FLOOR, owned)
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
        pending = self.pending
        # the fast path: the turn a period back (the latest fold's), compared event by event
        back = self.hint
        if back <= len(pending):
            expected = pending[-back][2]
        elif back - len(pending) <= len(self.recent):
            expected = self.recent[len(pending) - back]
        else:
            expected = None
        plan = self.plans.get(expected)
        if plan is not None and _repeats(turn, plan):
            turn_id = expected
        else:
            shape = signature(turn)
            ids = self.ids
            try:
                turn_id = ids.get(shape)
            except TypeError:  # a nested list (frozen params, a graph's history): frozen deeply
                shape = signature(turn, deep=True)
                turn_id = ids.get(shape)
            if turn_id is None:
                weight = _weight(shape) if len(ids) < MAX_SHAPES else 0
                if weight and (len(ids) < MIN_SHAPES
                               or self.shape_values + weight <= MAX_SHAPE_VALUES):
                    self.shape_values += weight
                    turn_id = ids[shape] = len(ids)
                    self.plans[turn_id] = _plan(turn)  # the turn the key was made from
                else:
                    turn_id, self.unique = self.unique, self.unique - 1
        shift = self.shift
        pending.append([start + shift, end + shift, turn_id])
        if turn_id != expected:
            self.streak = 0
        elif self.streak and len(pending) >= self.streak + self.context \
                and len(self.recent) >= self.keep * self.streak:
            self._fold(self.streak)  # what _decide would do (see _period)
            if self.streak:
                if self.streak == 1 and plan is not None:
                    self.in_row += 1
                    if self.in_row >= self.steady_after and self.run is not None:
                        # the next turns take the steady path, from the turn now open on
                        self.steady = steady = _Steady(turn_id, plan, turn, self.context)
                        resumable, self._resumable = self._resumable, None
                        if resumable is not None and resumable[0] == turn_id:
                            steady.prior = resumable[1]
                else:
                    self.in_row = 0
                    self._resumable = None
                return  # only the context is undecided: nothing else to decide yet
        self.in_row = 0
        self._resumable = None
        self._decide()

    def _decide(self) -> None:
        pending, recent = self.pending, self.recent
        while pending:
            period = self._period()
            if period:
                self._fold(period)
            elif len(pending) > 2 * self.max_period + self.context:
                start, end, turn_id = pending.pop(0)
                self._failed = self.streak = 0  # a new front
                self._kept(turn_id, start - self.shift, end - self.shift)
            else:
                return

    def _period(self) -> int:
        """The smallest period p such that the ``KEEP`` blocks of p decided turns before the
        front of the undecided ones, a block of p at that front and the ``CONTEXT`` turns after
        it all repeat with period p (0: none yet). The periods already found not to repeat for
        this front are not tried again (``_failed``).

        While the turns repeat with the period of the latest fold (``streak``: each turn closed
        since repeated the one that period before it), that period is the answer as soon as
        enough turns are undecided: every window a shorter period tests here holds what the
        same window held one period earlier, at the front before, where it did not repeat."""
        recent, pending, keep, context = self.recent, self.pending, self.keep, self.context
        front, undecided = len(recent), len(pending)
        p = self.streak
        if p and undecided >= p + context and front >= keep * p:
            return p
        for p in range(self._failed + 1, self.max_period + 1):
            if undecided < p + context or front < keep * p:
                return 0  # not enough turns to tell yet
            # the ids from the last turn of the context after the block back to the first
            # decided turn compared (front - keep * p): each equals the one p turns before it
            ids = list(map(_third, pending[p + context - 1::-1]))
            ids.extend(islice(reversed(recent), keep * p))
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
        pending = self.pending
        shift = self.shift
        start, end = pending[0][0] - shift, pending[period - 1][1] - shift
        run = self.run
        if run is None:  # what the folded turns were copies of, counted per shape id
            run = self.run = {"index": start, "seq": events[start].seq, "turns": 0, "events": 0,
                              "ids": {}}
        removed = end - start
        run["turns"] += period
        run["events"] += removed
        tally, counts, recent = run["ids"], self.counts, self.recent
        for first, last, turn_id in pending[:period]:
            if turn_id not in counts:  # the same for every turn of the shape: its events' kinds
                kinds = [e.kind for e in events[first - shift:last - shift]]
                counts[turn_id] = (kinds.count("step"), kinds.count("backward"), kinds.count("epoch_start"))
            tally[turn_id] = tally.get(turn_id, 0) + 1  # after its counts: marker() reads both
            recent.append(turn_id)
        del pending[:period]
        del events[start:end]
        self.shift = shift + removed  # every turn after the block moved back by removed
        self.start -= removed
        self._failed = 0  # a new front
        self.hint = period
        # the turns its test saw repeat with this period: the decided ones, the context after it
        self.streak = period if len(pending) == self.context else 0
        self.folded_turns += period

    # -- the folded event --------------------------------------------------------------------
    def marker(self) -> tuple[int, Event] | None:
        """The ``folded`` event of the fold in progress and the index it goes at, or None."""
        run = self.run
        if run is None:
            return None
        tally, counts, last_kept = run["ids"], self.counts, self.last_kept
        # a turn's kept copy is the same for the whole fold: a kept turn ends the fold first
        kind, data = ev.folded(turns=run["turns"],
                               steps=sum(counts[i][0] * n for i, n in tally.items()),
                               backwards=sum(counts[i][1] * n for i, n in tally.items()),
                               events=run["events"],
                               epochs=sum(counts[i][2] * n for i, n in tally.items()),
                               copies=[[*last_kept[i], n] for i, n in tally.items()])
        return run["index"], Event(run["seq"], kind, None, MappingProxyType(data))

    def close(self) -> bool:
        """End the fold in progress: its ``folded`` event goes into the trace where it was."""
        made = self.marker()
        if made is None:
            return False
        index, event = made
        self.run = None
        self.trace.events.insert(index, event)
        self.shift -= 1  # every turn after it moved on by one
        self.start += 1
        return True

    def finish(self) -> None:
        """The end of the run: the fold in progress ends; the undecided turns are kept."""
        self.materialize()
        self.close()
        self.pending.clear()

    # -- the steady state --------------------------------------------------------------------
    # Once ``steady_after`` turns in a row repeated the one before and folded at once (period
    # 1), each next turn would be folded two turns later (``CONTEXT``) without anything read
    # from it but its seqs and counts. The steady path (``steady_put``) takes the events of such
    # turns without ``observe``, the trace or ``_fold``: each must be the event the turn before
    # had at its place (kind and location), and a turn closes when its events are complete and
    # the next one's first comes, if its data repeat (``_repeats``, the same test as
    # ``_close_turn``'s). The trace and the folder stay as they were when the steady state began;
    # the turns since are counted, the last ``context`` of them kept aside with the open one.
    # ``materialize`` puts the folder and the trace where recording each turn would have put
    # them (the same folds, the same kept turns, the same seqs): at the first event that is not
    # the expected one (before it is recorded, so the deviating turn is recorded and judged as
    # always), when another thread, a holder or a snapshot needs the trace, and at the end.
    def steady_put(self, made: tuple, loc) -> Event | None:
        """The event on the steady path (its seq taken, kept aside), or None: not the expected
        event (the steady state has ended: it goes the usual way, ``observe`` first)."""
        steady = self.steady
        turn = steady.open
        j = len(turn)
        if steady.entered:
            if j == steady.length:  # the open turn is complete: this event must start the next
                if made[0] == steady.kinds[0] and (loc is steady.locs[0] or loc == steady.locs[0]) \
                        and _turn_repeats(turn, steady.plan):
                    steady.closed += 1
                    steady.kept.append(turn)
                    turn = steady.open = []
                    steady.made = False
                    j = 0
                else:
                    self.materialize()
                    return None
            elif made[0] != steady.kinds[j] or not (loc is steady.locs[j] or loc == steady.locs[j]):
                self.materialize()
                return None
        elif not self._enter(steady):
            return None
        else:
            turn = steady.open
            j = len(turn)
            if j >= steady.length or made[0] != steady.kinds[j] or not (
                    loc is steady.locs[j] or loc == steady.locs[j]):
                self.materialize()
                return None
        event = made_event(self.trace, made, loc)
        turn.append(event)
        steady.made = True
        return event

    def steady_accepts(self, heads: list) -> bool:
        """Whether ``steady_put`` would take events of these ``(kind, loc)`` in this order now
        (read only): a holder's events and the event that releases them go onto the steady
        path only together (``Recorder.emit``); else the steady state ends before any of them,
        as recording them would have cut the turns (``observe`` of the releasing event first)."""
        steady = self.steady
        if steady is None:
            return False
        if steady.entered:
            turn = steady.open
            j = len(turn)
        else:
            opened = self.trace.events[self.start:]
            if (len(self.pending) != self.context or len(opened) > steady.length
                    or [e.kind for e in opened] != steady.kinds[:len(opened)]
                    or [e.loc for e in opened] != steady.locs[:len(opened)]):
                return False
            turn, j = opened, len(opened)
        kinds, locs, wrapped = steady.kinds, steady.locs, False
        for kind, loc in heads:
            if j == steady.length:  # this event starts the next turn: the open one must repeat
                if wrapped or kind != kinds[0] or not (loc is locs[0] or loc == locs[0]) \
                        or not _turn_repeats(turn, steady.plan):
                    return False
                wrapped, j = True, 0
            elif kind != kinds[j] or not (loc is locs[j] or loc == locs[j]):
                return False
            j += 1
        return True

    def steady_take(self, steady: "_Steady", j: int, kind: str, loc, base, changes) -> bool:
        """The straight-line path of a hook (``steady_hooks``): in the steady state ``steady``,
        the event at place ``j`` of the turn is the one the hook emitted there when it was armed
        (``base``: that event's data; ``changes``: the values that differ from it, all of them
        values ``signature`` leaves out, or None), as the hook's own reads showed. Its seq is
        taken and it is kept aside unmade (``(seq, kind, loc, base, changes)``, made into an
        ``Event`` only if it is ever put in the trace: ``_realize``). False: not taken (another
        place, the steady state has ended or is another one, or the complete open turn does
        not repeat): the hook takes its full path, whose event goes the usual way."""
        if self.steady is not steady:
            return False
        turn = steady.open
        n = len(turn)
        if n != j:
            if j or n != steady.length:
                return False
            # the open turn is complete and this event starts the next: what steady_put checks
            # (a turn of unmade events only repeats by construction: _turn_repeats' first test)
            if steady.made and not _turn_repeats(turn, steady.plan):
                return False
            steady.closed += 1
            steady.kept.append(turn)
            turn = steady.open = []
            steady.made = False
        # (``kind`` and ``loc`` are those of the armed event, which went onto place ``j`` of
        # this steady state: place_of)
        trace = self.trace
        turn.append((trace.next_seq, kind, loc, base, changes))
        trace.next_seq += 1
        return True

    def skim_take(self, steady: "_Steady", j: int, kind: str, loc, base, changes) -> bool:
        """``steady_take`` for a hook at a later place (``j`` > 0) of a turn ``skimming``
        answered for: while nothing has ended the steady state or put an event in since, the
        event is appended unmade, nothing else tested (anything else: ``steady_take``)."""
        turn = steady.open
        if self.steady is steady and len(turn) == j and j:
            trace = self.trace
            turn.append((trace.next_seq, kind, loc, base, changes))
            trace.next_seq += 1
            return True
        return self.steady_take(steady, j, kind, loc, base, changes)

    def steady_ready(self, steady: "_Steady", j: int) -> bool:
        """Whether ``steady_take`` would take an event at place ``j`` now (its kind and location
        aside): read only, for a hook that must decide before it changes anything."""
        if self.steady is not steady:
            return False
        n = len(steady.open)
        return n == j or (j == 0 and n == steady.length
                          and (not steady.made or _turn_repeats(steady.open, steady.plan)))

    def skimming(self, steady: "_Steady", j: int) -> bool:
        """Whether the event at place ``j`` (its kind and location aside) belongs to a skimmed
        turn of the steady state ``steady`` (read only; ``steady_take`` takes it): the turns
        are counted from the steady state's first, and from ``skim_after`` on every one but the
        sampled ones (``SampleSchedule``: about one in ``skim_every``) is skimmed."""
        n = len(steady.open)
        if n == j and steady.skim_turn == steady.closed and self.steady is steady:
            return steady.skim_answer  # each later hook of a turn asks: answered already
        if self.steady is not steady:
            return False
        if n == j:
            turn = steady.closed
        elif j == 0 and n == steady.length:
            turn = steady.closed + 1  # the event that closes the open turn starts this one
        else:
            return False
        if turn == steady.skim_turn:  # each hook of a turn asks (never set without skim_after)
            return steady.skim_answer
        after = self.skim_after
        if after is None:
            return False
        schedule = steady.samples
        if schedule is None:
            schedule = steady.samples = SampleSchedule(
                self.skim_every, SKIM_EVERY_MAX, SKIM_LONGER, steady.prior)
        # a steady state taken up again after a snapshot: from its third turn (the first arms
        # the hooks) if the one before had lasted long enough
        # (a turn before the next sampled one is not sampled: SampleSchedule.sampled, unasked)
        answer = (turn >= after or (steady.prior >= after and turn >= 2)) \
            and (turn < schedule.next or not schedule.sampled(turn))
        steady.skim_turn, steady.skim_answer = turn, answer
        return answer

    @staticmethod
    def batch_varies(steady: "_Steady", j: int, batch) -> bool:
        """Whether the ``batch`` of the event at place ``j`` may differ from turn to turn on the
        straight-line path: it is the turn's first batch (``signature`` reads every other one
        relative to it, and it relative to itself), ``[loader, epoch, index]`` in ints, so any
        such batch of the same loader gives the same signature."""
        if type(batch) is not list or len(batch) != 3 or not all(type(v) is int for v in batch):
            return False
        first = next((s for s in steady.plan[4] if s[2] == _BATCH and s[3] is not None), None)
        return first is not None and first[0] == j and first[3] == (True, batch[0], 0, 0)

    def place_of(self, event) -> tuple | None:
        """``(steady state, place in the turn)`` of an event that has just gone on the steady
        path (what a hook arms its straight-line path with), or None."""
        steady = self.steady
        if (steady is not None and steady.entered and steady.open and steady.open[-1] is event
                and self.steady_hooks):
            return steady, len(steady.open) - 1
        return None

    def _enter(self, steady: "_Steady") -> bool:
        """Begin the steady state: the open turn's events so far leave the trace for the steady
        path (they must be the first events of the turn it repeats)."""
        events = self.trace.events
        start = self.start
        opened = events[start:]
        if (len(self.pending) != self.context or len(opened) > steady.length
                or [e.kind for e in opened] != steady.kinds[:len(opened)]
                or [e.loc for e in opened] != steady.locs[:len(opened)]):
            self.steady = None
            self.in_row = 0
            self._resumable = None
            return False
        del events[start:]
        steady.open = opened
        steady.made = True  # (Events, or none)
        steady.entered = True
        return True

    def materialize(self, resume: bool = False) -> None:
        """End the steady state: the folder and the trace as recording every turn since it
        began would have left them (see ``steady_put``). ``resume`` (a snapshot needs the
        trace; no turn deviated): the turns in a row that led to it still count, so the next
        turn that repeats the same one starts the steady state again, and that one skims as
        soon as its hooks are armed if this one had lasted ``skim_after`` turns."""
        steady, self.steady = self.steady, None
        in_row, self.in_row, self._resumable = self.in_row, 0, None
        if steady is None or not steady.entered:
            return
        events = self.trace.events
        for turn in (*steady.kept, steady.open):  # the hooks' straight-line events made now
            if not all(map(is_not, map(type, turn), repeat(tuple))):
                _realize(turn)
        aside = [event for turn in (*steady.kept, steady.open) for event in turn]
        try:
            closed, turn_id = steady.closed, steady.turn_id
            real = min(closed, len(self.pending))  # the undecided turns folded by the next ones
            for _ in range(real):
                self._fold(1)
            unseen = closed - real  # turns folded without ever being in the trace
            if unseen:
                run = self.run
                tally = run["ids"]
                run["turns"] += unseen
                run["events"] += unseen * steady.length
                tally[turn_id] = tally.get(turn_id, 0) + unseen
                self.recent.extend(repeat(turn_id, min(unseen, self.recent.maxlen or 0)))
                self.folded_turns += unseen
            shift = self.shift
            for turn in steady.kept:  # the last ``context`` turns, undecided
                start = len(events)
                events.extend(turn)
                self.pending.append([start + shift, len(events) + shift, turn_id])
            steady.kept.clear()
            self.streak, self.hint, self._failed = 1, 1, 0
            # the open turn, as observe would have seen it
            self.start, self.applied, self.prev, self.seen = len(events), False, None, set()
            opened, steady.open = steady.open, []
            for event in opened:
                self.observe(event.kind, event.loc)
                events.append(event)
            if resume:
                self.in_row, self._resumable = in_row, (turn_id, steady.prior + closed)
        except Exception:  # the events kept aside go into the trace; folding ends (Recorder)
            there = set(map(id, events))
            events.extend(event for event in aside if id(event) not in there)
            raise


class _Steady:
    """The steady state of a ``Folder``: the turn every turn repeats (its shape id, its plan, its
    events' kinds and locations), the turns closed on the steady path, the last ``context`` of
    them and the open one (events kept aside, in seq order)."""

    __slots__ = ("turn_id", "plan", "kinds", "locs", "length", "closed", "kept", "open", "entered",
                 "skim_turn", "skim_answer", "samples", "prior", "made")

    def __init__(self, turn_id: int, plan: tuple, turn: list[Event], context: int):
        self.turn_id, self.plan = turn_id, plan
        self.kinds = [e.kind for e in turn]
        self.locs = [e.loc for e in turn]
        self.length = len(turn)
        self.closed = 0
        self.kept: deque = deque(maxlen=context)  # the last closed turns' events
        self.open: list[Event] = []
        self.made = False  # whether the open turn holds an Event (else only unmade ones)
        self.entered = False
        self.skim_turn, self.skim_answer = -1, False  # Folder.skimming's latest answer
        self.samples: SampleSchedule | None = None  # its sampled turns, made when first asked
        self.prior = 0  # turns of the steady states a snapshot ended just before this one
