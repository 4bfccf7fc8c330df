"""The learning rate each optimizer really applies: its schedulers and the lr timeline.

Built from the trace (no torch): ``optimizer_init.lrs`` (each group's lr as constructed),
``scheduler_init`` (a scheduler's optimizer, its schedule's arguments, the lr it set at
construction), ``scheduler_step.lrs`` (what each user call of ``scheduler.step()`` wrote) and
``step_begin.lrs`` (what each optimizer step read). A value a step reads that no recorded write
explains was written by the script itself (``group["lr"] = ...`` between two steps; graddoctor
compares values instead of watching the groups' dicts, which keeps the step's cost at a few
dict reads).

Public API (also for the report's pictures):

* ``Analysis.lr_timeline`` -> ``{opt: {group index: [LrPoint(step, lr, writer), ...]}}``: per
  optimizer and param group, the lr at each of its recorded optimizer steps (``step``: the
  1-based step number of ``Analysis.step_number``; ``lr``: None when not a plain number), and
  the ``LrWriter`` of that value: ``kind`` "optimizer" (as constructed), "scheduler" (a
  scheduler's construction or ``step()``: ``cls``, ``sched``, ``args``) or "manual" (the
  script's own assignment; ``loc`` the assignment line when the source shows one, else None),
  with ``loc`` the line that wrote it. In a folded long run (instrument/fold.py) the timeline
  holds the kept steps only.
* ``Analysis.schedulers`` -> ``{sched: Schedule}``: every scheduler, its construction, its user
  steps and the counts rules judge with (folded copies included).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from ..trace import Event, Location
from .windows import typical

if TYPE_CHECKING:
    from . import Analysis

# schedulers whose step() is not a position in a fixed schedule
NOT_POSITIONAL = frozenset({"ReduceLROnPlateau"})
# schedulers that step others they hold (``children``)
CONTAINERS = frozenset({"SequentialLR", "ChainedScheduler"})


_SCHEDULER, _MANUAL = "scheduler", "manual"


@dataclass(frozen=True)
class LrWriter:
    kind: str  # "optimizer" | "scheduler" | "manual"
    loc: Location | None = None
    cls: str | None = None  # the scheduler's class
    sched: int | None = None
    args: dict = field(default_factory=dict)  # the scheduler's schedule arguments
    call: str | None = None  # "init" | "step" for a scheduler

    @property
    def scheduled(self) -> bool:
        return self.kind == _SCHEDULER

    @property
    def by_hand(self) -> bool:
        return self.kind == _MANUAL


class LrPoint(NamedTuple):
    step: int | None  # the optimizer step's number (Analysis.step_number)
    lr: float | None
    writer: LrWriter


@dataclass
class Schedule:
    """One scheduler as the rules see it."""

    sched: int
    cls: str
    opt: int | None
    init: Event | None = None
    args: dict = field(default_factory=dict)
    parent: int | None = None  # the SequentialLR / ChainedScheduler that steps it
    steps: list[Event] = field(default_factory=list)  # the user's step() calls (recorded)
    count: int = 0  # how many times the user stepped it (folded copies included)

    @property
    def positional(self) -> bool:
        return self.cls not in NOT_POSITIONAL

    @property
    def first_factor(self) -> float | None:
        """The lr it set at construction over the lr it started from (a warm-up's start
        factor: LinearLR(start_factor=0.01) gives 0.01), for the first group; None unknown."""
        init = self.init
        if init is None:
            return None
        lrs, base = init.get("lrs"), init.get("base_lrs")
        if not lrs or not base or lrs[0] is None or not base[0]:
            return None
        return lrs[0] / base[0]


def schedules(a: "Analysis") -> dict[int, Schedule]:
    found: dict[int, Schedule] = {}
    for e in a.events:
        if e.kind == "scheduler_init":
            s = found.get(e["sched"])
            if s is None:
                s = found[e["sched"]] = Schedule(e["sched"], e.get("cls") or "", e.get("opt"))
            s.init, s.args, s.cls, s.opt = e, dict(e.get("args") or {}), e.get("cls") or s.cls, e.get("opt")
            for child in e.get("children") or ():
                found.setdefault(child, Schedule(child, "", e.get("opt"))).parent = e["sched"]
        elif e.kind == "scheduler_step":
            s = found.get(e["sched"])
            if s is None:
                s = found[e["sched"]] = Schedule(e["sched"], e.get("cls") or "", e.get("opt"))
            s.steps.append(e)
    for s in found.values():
        s.count = a.count(s.steps)
    return found


def stepped(all_schedules: dict[int, Schedule], s: Schedule) -> bool:
    """Stepped by the user, directly or through the container that holds it."""
    seen = set()
    while s is not None and s.sched not in seen:
        if s.count:
            return True
        seen.add(s.sched)
        s = all_schedules.get(s.parent) if s.parent is not None else None
    return False


def epoch_began_after(a: "Analysis", seq: int) -> bool:
    """A DataLoader epoch began after the event with that seq (one folded out counts)."""
    for e in a.after(seq):
        if e.kind == "epoch_start" or (e.kind == "folded" and e.get("epochs")):
            return True
    return False


def manual_lines(a: "Analysis", cache: dict, loc: Location | None) -> list[int]:
    if loc is None or not loc.path:
        return []
    if loc.path not in cache:
        cache[loc.path] = a.source.lr_assignment_lines(loc.path)
    return cache[loc.path]


def timeline(a: "Analysis") -> dict[int, dict[int, list[LrPoint]]]:
    out: dict[int, dict[int, list[LrPoint]]] = {}
    known: dict[int, list[tuple[float | None, LrWriter]]] = {}  # opt -> per group: value, writer
    folded: set[int] = set()  # optimizers whose writes a fold may hide since their last step
    sources: dict[str, list[int]] = {}  # path -> its lr assignment lines
    for e in a.events:
        kind = e.kind
        if kind == "folded":
            folded.update(known)
        elif kind == "optimizer_init":
            lrs = e.get("lrs")
            if lrs is None:
                continue
            writer = LrWriter("optimizer", e.loc)
            known.setdefault(e["opt"], []).extend((lr, writer) for lr in lrs)
        elif kind in ("scheduler_init", "scheduler_step"):
            opt, lrs = e.get("opt"), e.get("lrs")
            if opt is None or lrs is None:
                continue
            writer = LrWriter("scheduler", e.loc, e.get("cls"), e.get("sched"),
                              dict(e.get("args") or {}) if kind == "scheduler_init"
                              else _args_of(a, e.get("sched")),
                              "init" if kind == "scheduler_init" else "step")
            known[opt] = [(lr, writer) for lr in lrs]
        elif kind == "step_begin":
            lrs = e.get("lrs")
            if lrs is None:
                continue
            opt = e["opt"]
            before = known.get(opt, [])
            groups = out.setdefault(opt, {})
            number = a.next_step_number(e.seq)
            now = []
            for g, lr in enumerate(lrs):
                old = before[g] if g < len(before) else None
                if old is not None and (old[0] == lr or lr is None or opt in folded):
                    writer = old[1]  # after a fold: the writer of the folded turns, as kept
                elif old is None and not before:
                    writer = LrWriter("optimizer", a.optimizers[opt].loc if opt in a.optimizers else None)
                else:
                    writer = LrWriter("manual", _manual_loc(a, sources, e.loc))
                now.append((lr, writer))
                groups.setdefault(g, []).append(LrPoint(number, lr, writer))
            known[opt] = now
            folded.discard(opt)
    return out


def _args_of(a: "Analysis", sched) -> dict:
    s = a.schedulers.get(sched)
    return dict(s.args) if s is not None else {}


def _manual_loc(a: "Analysis", sources: dict, step_loc: Location | None) -> Location | None:
    """The script's ``...["lr"] = ...`` line closest above the step (the write happened between
    two steps; the source says where), else None."""
    lines = manual_lines(a, sources, step_loc)
    if not lines or step_loc is None:
        return None
    above = [n for n in lines if n < step_loc.line]
    line = max(above) if above else lines[0]
    return Location(step_loc.path, line, step_loc.function)


# -- what the rules judge schedules with: counts (folded copies included) ---------------------

@dataclass(frozen=True)
class Cadence:
    """How often a scheduler is stepped, against its optimizer's steps and the DataLoader."""

    per_update: float  # user steps of the scheduler per step of its optimizer (from its first on)
    most_between: int  # most recorded scheduler steps between two steps of its optimizer
    updates: int  # optimizer steps from the scheduler's first step on
    per_backward: float  # scheduler steps per backward call, same span
    epoch_most: int  # most scheduler steps within one DataLoader epoch (0 without a loader)
    epoch_updates: int  # most optimizer steps within one DataLoader epoch
    epochs_seen: int  # DataLoader epochs in which the scheduler or its optimizer stepped
    real_len: int | None  # the training DataLoader's real length (batches per epoch)
    replay_len: int | None  # its length in the replay (``--epoch-batches``: what len(loader)
    # returned to the script while graddoctor ran it)

    def lengths(self) -> tuple[int, ...]:
        """The epoch lengths a schedule sized with len(loader) may have been given."""
        return tuple(n for n in {self.real_len, self.replay_len} if n)


def training_loader(a: "Analysis") -> tuple[int | None, int | None, int | None]:
    """(the DataLoader most backwards drew their batch from, its real length, its length in
    the replay)."""
    uses: dict[int, int] = {}
    for e in a.by_kind.get("backward", ()):
        batch = e.get("batch")
        if batch:
            uses[batch[0]] = uses.get(batch[0], 0) + 1
    if not uses:
        return None, None, None
    loader = max(uses, key=uses.get)
    start = next((e for e in a.by_kind.get("epoch_start", ()) if e.get("loader") == loader), None)
    if start is None:
        return loader, None, None
    return loader, start.get("real_len") or None, start.get("replay_len") or None


def cadence(a: "Analysis", s: Schedule) -> Cadence | None:
    if not s.steps or s.opt is None:
        return None
    first = s.steps[0].seq
    # a fresh scheduler fast-forwarded before training (`for _ in range(start_epoch):
    # scheduler.step()` on resuming): its cadence counts from the last of those steps
    update = next((st.seq for st in a.steps if st["opt"] == s.opt), None)
    replayed = [st for st in s.steps if update is not None and st.seq < update]
    count = s.count
    if len(replayed) > 1:
        first = replayed[-1].seq
        count -= a.count(replayed[:-1])
    mine = [st for st in a.steps if st["opt"] == s.opt and st.seq > first]
    updates = a.count(mine)
    backwards = a.count(b for b in a.by_kind.get("backward", ()) if b.seq > first)
    most, since = 0, 0
    for e in a.events:
        if e.seq < first:
            continue
        if e.kind == "scheduler_step" and e.get("sched") == s.sched:
            since += 1
        elif e.kind == "step" and e.get("opt") == s.opt:
            most, since = max(most, since), 0
    loader, real, replay = training_loader(a)

    def key(e):
        if e.kind == "scheduler_step" and e.get("sched") == s.sched:
            return "sched"
        if e.kind == "step" and e.get("opt") == s.opt:
            return "step"
        return None

    groups = a.by_epoch(key) if loader is not None else {}
    sched_in = {ep: n for (k, ep), (_, n) in groups.items() if k == "sched" and ep is not None}
    steps_in = {ep: n for (k, ep), (_, n) in groups.items() if k == "step" and ep is not None}
    return Cadence(
        per_update=count / updates if updates else float("inf"),
        most_between=most, updates=updates,
        per_backward=count / backwards if backwards else 0.0,
        epoch_most=max(sched_in.values(), default=0),
        epoch_updates=max(steps_in.values(), default=0),
        epochs_seen=len(set(sched_in) | set(steps_in)), real_len=real, replay_len=replay)


def length(s: Schedule) -> int | None:
    """The schedule's length in its own steps, where its arguments say it."""
    args = s.args
    for name in ("total_steps", "T_max", "total_iters", "num_training_steps"):
        value = args.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


TWICE_PER_BACKWARD = 1.5  # scheduler steps per backward from which micro-batches explain nothing


@dataclass(frozen=True)
class SteppedTwice:
    k: float  # scheduler steps per optimizer step
    length: int | None  # the schedule's length, when its arguments say it
    lines: tuple  # the distinct step() call events, first of each line, in order


def stepped_twice(a: "Analysis", s: Schedule) -> SteppedTwice | None:
    """A positional scheduler stepped k >= 2 times per step of its optimizer, at least twice
    between two of its steps, and more often than backward calls ran: not once per micro-batch
    (accumulation), but the same scheduler's step() called twice per update (two calls left in
    the loop, a training helper that steps it too)."""
    if not s.positional or s.parent is not None or s.cls in CONTAINERS:
        return None
    c = cadence(a, s)
    if c is None or c.updates < 3 or c.per_update < 1.9 or c.most_between < 2 or \
            c.per_backward < TWICE_PER_BACKWARD:
        return None
    lines: dict = {}
    for e in s.steps:
        if e.loc is not None:
            lines.setdefault((e.loc.path, e.loc.line), e)
    return SteppedTwice(c.per_update, length(s), tuple(lines.values()))


@dataclass(frozen=True)
class MicroBatchStepping:
    k: float  # scheduler steps per optimizer step
    length: int | None  # the schedule's length, when its arguments say it
    sized_in_updates: bool  # that length is a whole number of the epoch's optimizer steps


def per_micro_batch(a: "Analysis", s: Schedule) -> MicroBatchStepping | None:
    """A positional scheduler stepped after every micro-batch of an accumulation window (k
    steps per optimizer step), unless its length counts micro-batches (a whole number of the
    DataLoader's batches: it then ends with training, whatever k)."""
    if not s.positional:
        return None
    c = cadence(a, s)
    if c is None or c.updates < 2 or c.per_update < 1.5 or c.most_between < 2 or c.per_backward < 0.75:
        return None
    if c.per_backward >= TWICE_PER_BACKWARD:
        return None  # more scheduler steps than backwards: no accumulation explains it (stepped_twice)
    n = length(s)
    if n is not None and any(n % m == 0 for m in c.lengths()):
        return None  # sized in batches: per-batch stepping is its design
    k = c.per_update
    per_epoch = [int(round(m / k)) for m in c.lengths()]
    return MicroBatchStepping(k, n, bool(n and any(p and n % p == 0 for p in per_epoch)))


# -- a learning rate that collapses while the run goes on --------------------------------------

COLLAPSED = 1e-4  # the lr applied below this share of its start: the updates no longer move
STEEP = 1e-2  # fallen this far at a steady rate: below COLLAPSED within as many steps again
OVERTAKEN = 0.1  # a decay that overtook its warm-up: fallen this far from its highest point
GOES_ON = frozenset({"step-limit", "timeout"})  # graddoctor stopped a script that went on stepping
# schedulers that set the lr from their own arguments or by a metric, or restart it
# (a cosine climbs back after its minimum: scheduler-period-mismatch judges its period)
_NOT_DECAYS = frozenset({"ReduceLROnPlateau", "OneCycleLR", "CyclicLR", "CosineAnnealingWarmRestarts",
                         "CosineAnnealingLR"})
# schedules whose fall has no floor (a factor per step): a steep start projects a collapse
_UNFLOORED = frozenset({"ExponentialLR", "StepLR", "MultiplicativeLR", "LambdaLR"})


@dataclass(frozen=True)
class Collapse:
    opt: int
    group: int
    start: float  # the lr the group started from (its peak before a decay)
    last: float  # the lr of the last recorded step
    updates: int  # the optimizer's steps (folded ones included)
    writer: LrWriter  # who wrote the last lr
    observed: bool  # below COLLAPSED in the run; False: projected at the rate seen
    at: int | None  # projected: the update by which it falls below COLLAPSED


def collapses(a: "Analysis") -> list[Collapse]:
    """Param groups whose lr fell below ``COLLAPSED`` of where it started (or falls there at the
    steady rate of a ``STEEP`` fall, for a schedule without a floor) while the script still
    stepped: graddoctor stopped it at its step budget or time limit. Judged from what folding
    keeps (the first and last recorded steps, the construction, the counts): the start is the
    largest of the group's constructed lr, its schedulers' base lrs and its first step's lr,
    so a warm-up's climb is no fall."""
    if a.status not in GOES_ON:
        return []
    out = []
    for opt, g, points, updates, start in _group_lrs(a, min_points=2):
        first, last = points[0], points[-1]
        if start <= 0 or last.lr < 0 or last.lr >= STEEP * start or last.lr >= first.lr:
            continue  # not fallen (a warm-up whose factor is still 0 never rose)
        w = last.writer
        if not (w.scheduled or w.by_hand) or (w.scheduled and w.cls in _NOT_DECAYS):
            continue
        if w.by_hand and last.lr == 0:
            continue  # the script sets 0 itself (a phase that freezes the group)
        s = a.schedulers.get(w.sched) if w.scheduled else None
        if s is not None and per_micro_batch(a, s) is not None:
            continue  # stepped per micro-batch: scheduler-per-micro-batch says why
        if last.lr < COLLAPSED * start:
            out.append(Collapse(opt, g, start, last.lr, updates, w, True, None))
            continue
        # steep but not yet collapsed: a steady rate from an undecayed start projects it
        if last.lr <= 0 or (w.scheduled and w.cls not in _UNFLOORED):
            continue
        if first.lr < start * (1 - 1e-6):
            # a warm-up the decay overtook (`base * min(1, s / warmup) * 0.5 ** s`): the lr
            # never reached its start; the steady fall from its highest point is the rate, when
            # it has fallen OVERTAKEN times within the replay already
            top = max(range(len(points)), key=lambda i: points[i].lr if points[i].lr is not None else -1.0)
            if points[top].lr is None or last.lr > OVERTAKEN * points[top].lr or len(points) < 2 \
                    or points[-2].lr is None or last.lr >= points[-2].lr * (1 - 1e-9):
                continue  # not fallen that far, or held at a floor by the last steps
            first, points, start = points[top], points[top:], points[top].lr
        if any(p.lr is None or q.lr is None or q.lr > p.lr * (1 + 1e-9)
               for p, q in zip(points, points[1:])):
            continue  # it rose again somewhere: no steady fall
        span = (last.step or updates) - (first.step or 1)
        if span < 3:
            continue
        rate = math.log(last.lr / first.lr) / span
        at = (first.step or 1) + math.ceil(math.log(COLLAPSED) / rate)
        out.append(Collapse(opt, g, start, last.lr, updates, w, False, at))
    return out


def _group_lrs(a: "Analysis", min_points: int):
    """``(opt, group, its recorded lr points, the optimizer's updates, the largest lr the script
    set for it)`` for each param group with ``min_points`` recorded lrs or more, the first and
    last known, of an optimizer stepped 4 times or more. The largest lr set: the group's
    constructed lr, its schedulers' base lrs and its first step's lr (a warm-up's climb is no
    fall, a scaled peak no runaway)."""
    built_lrs: dict[int, list] = {}  # opt -> each group's constructed lr, in group order
    for e in a.by_kind.get("optimizer_init", ()):
        # one event per add_param_group call: torch's constructor adds each group in turn
        built_lrs.setdefault(e.get("opt"), []).extend(e.get("lrs") or ())
    for opt, groups in a.lr_timeline.items():
        built = built_lrs.get(opt, [])
        bases = [s.init.get("base_lrs") or [] for s in a.schedulers.values()
                 if s.opt == opt and s.init is not None]
        updates = a.count(e for e in a.steps if e.get("opt") == opt)
        for g, points in groups.items():
            if len(points) < min_points or updates < 4:
                continue
            first, last = points[0], points[-1]
            if first.lr is None or last.lr is None:
                continue
            set_lrs = [first.lr] + [lrs[g] for lrs in [built, *bases] if g < len(lrs)]
            yield opt, g, points, updates, max(
                (v for v in set_lrs if isinstance(v, (int, float))), default=0.0)


def writer_location(a: "Analysis", writer: LrWriter, opt: int) -> tuple:
    """``(where to point, the scheduler's first step() or None)`` for the lr ``writer`` set: the
    scheduler's construction, else the script's own write, else the optimizer's first step."""
    loc, step_call = writer.loc, None
    if writer.scheduled:
        s = a.schedulers.get(writer.sched)
        if s is not None and s.init is not None and s.init.loc is not None:
            loc = s.init.loc
        step_call = s.steps[0] if s is not None and s.steps else None
    if loc is None:
        loc = next((e.loc for e in a.steps if e.get("opt") == opt and e.loc), None)
    return loc, step_call


# -- a learning rate that keeps rising past every lr the script set ------------------------------

RUNAWAY = 10.0  # the lr applied this many times above every lr the script set: seen running away
RISING = 2.0  # this far above and still rising at a steady pace: said as info
RANGE_TEST_START = 1e-5  # an lr range test (torch-lr-finder) starts at or below this and climbs on purpose
# schedules whose rise has no ceiling (a factor per step, a function of the step)
_UNCAPPED = frozenset({"ExponentialLR", "StepLR", "MultiplicativeLR", "LambdaLR"})


@dataclass(frozen=True)
class Growth:
    opt: int
    group: int
    top: float  # the largest lr the script set: constructed, a scheduler's base, the first step's
    last: float  # the lr of the last recorded step
    updates: int
    writer: LrWriter
    observed: bool  # RUNAWAY times above top; False: RISING times and still rising
    turned: bool = False  # it fell from the first step, then climbed: a decay turned around


def _rise_after_fall(points) -> bool:
    """Whether the lrs fell from the first point to the second, held or fell on to a lowest
    point, and rose at every point after it: a decay that turned into a climb (a warm-up
    branch taken after the warm-up). Read over the kept points: a long run's folded steps keep
    the first two and the last, and the shape holds over any subset of them."""
    lrs = [p.lr for p in points]
    if len(lrs) < 3 or any(v is None for v in lrs) or not lrs[1] < lrs[0]:
        return False
    turn = max(j for j in range(1, len(lrs)) if lrs[j] <= lrs[j - 1])
    return turn < len(lrs) - 1 and all(q <= p for p, q in zip(lrs[:turn], lrs[1:turn + 1]))


def growths(a: "Analysis") -> list[Growth]:
    """Param groups whose lr rose at every recorded step, past ``RUNAWAY`` times (or ``RISING``
    times: info) the largest lr the script set, under a schedule without a ceiling or the
    script's own writes, while the script still stepped. From what folding keeps: the first and
    last steps' lrs, the constructions, the counts; the rise checked over the kept steps."""
    if a.status not in GOES_ON:
        return []
    out = []
    for opt, g, points, updates, top in _group_lrs(a, min_points=4):
        first, last = points[0], points[-1]
        if not last.lr > first.lr > 0:
            continue
        w = last.writer
        if top <= RANGE_TEST_START or last.lr < RISING * top or not (w.by_hand or
                                                       (w.scheduled and w.cls in _UNCAPPED)):
            continue
        if any(p.lr is None or q.lr is None or q.lr <= p.lr for p, q in zip(points, points[1:])):
            # it held or fell somewhere: a warm-up that reached its peak, a cycle; but a decay
            # from the first step that turned into a climb past every lr the script set has no
            # reading but a schedule whose branches run in the wrong order
            if not _rise_after_fall(points) or _range_test(a, w):
                continue
            out.append(Growth(opt, g, top, last.lr, updates, w, True, turned=True))
            continue
        if w.scheduled and w.cls == "LambdaLR" and _factor_capped(a, w):
            continue  # a warm-up longer than the replay, to a peak its lambda caps
        if w.by_hand and w.loc is not None and a.source.written_lr_capped(w.loc.path, w.loc.line):
            continue  # the same for the script's own writes: a cycle or a warm-up it caps
        if _range_test(a, w) or _handed_over(a, opt):
            continue  # an lr range test: it climbs until the loss diverges, then stops
        out.append(Growth(opt, g, top, last.lr, updates, w, last.lr >= RUNAWAY * top))
    return out


def _range_test(a: "Analysis", w: LrWriter) -> bool:
    """Whether the code that raises the lr (the scheduler's ``step()`` calls, or the script's own
    write) sits in a function that stops when the loss diverges (analysis/source.py's
    ``stops_on_divergence``): an lr range test whose start is above ``RANGE_TEST_START``."""
    if w.scheduled:
        s = a.schedulers.get(w.sched)
        locs = [e.loc for e in (s.steps[:1] if s is not None else ()) if e.loc is not None]
    else:
        locs = [w.loc] if w.loc is not None else []
    return any(a.source.stops_on_divergence(loc.path, loc.line) for loc in locs)


def _handed_over(a: "Analysis", opt: int) -> bool:
    """Whether the optimizer stopped stepping and training went on with another one whose first
    step came after its last: a probe run for a fixed number of steps (an lr range test that
    climbs on purpose, then training starts over with a fresh optimizer), not a schedule that
    keeps rising while the script trains on."""
    mine = [s.seq for s in a.steps if s.get("opt") == opt]
    if not mine:
        return False
    firsts: dict = {}
    for s in a.steps:
        other = s.get("opt")
        if other != opt and other not in firsts:
            firsts[other] = s.seq
    return any(seq > mine[-1] for seq in firsts.values())


def _factor_capped(a: "Analysis", w: LrWriter) -> bool:
    """Whether the lambda of the ``LambdaLR`` that wrote ``w`` has a ceiling in its text (a
    ``min`` of two terms, a clamp, a branch: analysis/source.py's ``factor_capped``): its rise in
    the replay is a warm-up longer than the replay, to a peak the lambda sets."""
    s = a.schedulers.get(w.sched)
    init = s.init if s is not None else None
    if init is None or init.loc is None:
        return False
    return a.source.factor_capped(init.loc.path, init.loc.line, "LambdaLR")


# -- a schedule projected over the run the script plans -----------------------------------------

SPENT_SHARE = 0.1  # a per-batch schedule spent within this share of the planned run
FLOOR = 0.01  # a decay down to this share of its start has done its work (100x)
STILL_SHARE = 0.2  # a per-epoch schedule that covers at most this share of its length
PER_UPDATE = (0.9, 1.1)  # scheduler steps per optimizer step of a schedule stepped per batch


@dataclass(frozen=True)
class Plan:
    """The run the script plans, in the steps a scheduler is stepped in."""

    unit: str  # "batch" (stepped after every optimizer step) | "epoch" (once per epoch)
    steps: int  # the scheduler's steps over the planned run
    epochs: int | None  # the planned epochs, when the loop counts epochs
    per_epoch: int | None  # scheduler steps per epoch (stepped per batch, real DataLoader length)
    described: str  # how it was read, for a message
    lengths: tuple  # the epoch lengths a length sized with len(loader) may have been given
    real_len: int | None
    replay_len: int | None
    k: int = 1  # micro-batches accumulated per optimizer step
    updates: int | None = None  # the run's optimizer steps, where a framework counts them
    # (Lightning's max_steps): a schedule of that length is sized in optimizer steps
    hand: "HandLoop | None" = None  # a loop without a DataLoader: its passes are the epochs


def planned_run(a: "Analysis", s: Schedule) -> Plan | None:
    """How many times the scheduler is stepped over the run the script plans: the loop around
    its training DataLoader's loop (``epoch_start``'s ``planned``, instrument/planned.py) times
    the updates of a real epoch for a scheduler stepped once per optimizer step, the epochs for
    one stepped once per epoch; None when either is unclear."""
    loader, real_len, replay_len = training_loader(a)
    if loader is None:
        return _hand_loop_run(a, s)
    start = next((e for e in a.by_kind.get("epoch_start", ()) if e.get("loader") == loader
                  and e.get("planned")), None)
    if start is None:
        return None
    unit, count = start["planned"]
    c = cadence(a, s)
    if c is None or c.updates < 3 or not isinstance(count, int) or count <= 0:
        return None
    lengths = c.lengths()
    # once per update: the ratio, or (a short replay) one scheduler step more than the updates
    # counted after its first step, which come after the first update
    per_update = (PER_UPDATE[0] <= c.per_update <= PER_UPDATE[1]
                  or 0 <= s.count - c.updates <= 1) and c.most_between <= 1
    k = typical([w.k for w in a.windows.get(s.opt, [])]) or 1
    if per_update and unit == "epochs" and real_len:
        per = max(1, real_len // k)
        steps = count * per
        acc = f" of {k} accumulated batches" if k > 1 else ""
        return Plan("batch", steps, count, per,
                    f"{count} epochs × {per:,} updates{acc} = {steps:,} steps", lengths,
                    real_len, replay_len, k)
    if per_update and unit == "steps" and k == 1:
        return Plan("batch", count, None, real_len, f"the loop's {count:,} steps", lengths,
                    real_len, replay_len)
    if unit == "epochs" and c.epoch_most == 1 and c.epochs_seen >= 2 and c.per_update < 0.5:
        return Plan("epoch", count, count, None, f"{count} epochs", lengths, real_len, replay_len)
    if unit == "updates" and real_len:
        return _updates_plan(c, s, count, per_update, k, lengths, real_len, replay_len)
    return None


def _updates_plan(c: Cadence, s: Schedule, count: int, per_update: bool, k: int, lengths,
                  real_len: int, replay_len: int | None) -> Plan | None:
    """The run a framework ends after ``count`` optimizer steps (Lightning's ``max_steps``), in
    the unit the scheduler is stepped in. An epoch's updates are the ones seen in a whole epoch
    of the replay (a framework's accumulation is not always a window graddoctor judges), scaled
    to the real epoch when the replay shortened it."""
    per = max(1, real_len // k)
    if c.epochs_seen >= 2 and c.epoch_updates:
        seen = replay_len or real_len
        per = max(1, round(c.epoch_updates * real_len / seen))
    epochs = -(-count // per)
    if per_update:
        return Plan("batch", count, epochs, per, f"max_steps={count:,} optimizer steps", lengths,
                    real_len, replay_len, k, updates=count)
    if c.epoch_most == 1 and c.epochs_seen >= 2 and c.per_update < 0.5:
        return Plan("epoch", epochs, epochs, None,
                    f"max_steps={count:,} optimizer steps, {epochs:,} epochs of {per:,} updates",
                    lengths, real_len, replay_len, k, updates=count)
    return None


STRAIGHT = 1e-3  # relative spread of a LambdaLR's factors around a straight line


def factor_line(a: "Analysis", s: Schedule) -> tuple[float, float, int, float] | None:
    """A ``LambdaLR``'s factor (its lr over its base lr, first group) against its own steps
    (construction: 0, then each user step() in turn, folded copies counted), when it runs on
    a straight line that moves: ``(factor at construction, change per step, the last step
    recorded, its factor)``. Three recorded points on the line, or two where the lambda's text
    is a straight line in its step (analysis/source.py's ``factor_straight``): a schedule
    stepped once per epoch shows no more in a short replay. None otherwise."""
    init = s.init
    if s.cls != "LambdaLR" or init is None or not s.steps:
        return None
    base, first = (init.get("base_lrs") or [None])[0], (init.get("lrs") or [None])[0]
    if not isinstance(base, (int, float)) or base <= 0 or not isinstance(first, (int, float)):
        return None
    points, n = [(0, first / base)], 0
    for e in s.steps:
        lr = (e.get("lrs") or [None])[0]
        n += 1
        if not isinstance(lr, (int, float)):
            return None
        points.append((n, lr / base))
        n += a.weight(e) - 1  # folded copies of this step's turn come after it
    (n0, f0), (n1, f1) = points[0], points[-1]
    if n1 <= n0 or f1 == f0:
        return None
    slope = (f1 - f0) / (n1 - n0)
    scale = max(abs(f0), abs(f1))
    if any(abs(f - (f0 + slope * (m - n0))) > STRAIGHT * scale for m, f in points[1:-1]):
        return None
    if len(points) < 3:
        loc = init.loc
        if loc is None or not a.source.factor_straight(loc.path, loc.line, "LambdaLR"):
            return None
    return f0, slope, n1, f1


def lambda_decay_end(a: "Analysis", s: Schedule) -> int | None:
    """The step at which a hand-written ``LambdaLR`` falling on a straight line reaches 0
    (``lambda e: 1 - e / total``), or None."""
    if "num_training_steps" in s.args:
        return None  # transformers' schedules say their length
    line = factor_line(a, s)
    if line is None:
        return None
    f0, slope, n1, f1 = line
    if slope >= 0 or f1 <= 0 or f0 <= 0:
        return None
    return math.ceil(n1 + f1 / -slope - 1e-9)


@dataclass(frozen=True)
class HandLoop:
    """A training loop without a DataLoader (batches sliced or drawn by hand) inside a loop
    that counts its passes: ``for epoch in range(E): for i in range(0, n, bs): ...``."""

    epochs: int  # the planned passes of the outer loop (the count of its range)
    per_pass: int  # optimizer updates in one pass, from the first passes the replay ran
    line: Location | None  # the outer loop's header


def hand_loop(a: "Analysis") -> HandLoop | None:
    """The plan of a script whose training loop has no DataLoader, from the step budget's wait
    for the next pass of the loop around it (instrument/phases.py's ``phase_hold``): the loop's
    count in the source and the updates of the passes done before the next began. None with a
    DataLoader, or when the wait did not tell both."""
    for e in a.by_kind.get("phase_hold", ()):
        planned, passes, until = e.get("planned"), e.get("passes"), e.get("until")
        if e.get("wait") != "loop" or e.get("cut") is not None or not planned \
                or planned[0] != "epochs" or type(passes) is not int or passes <= 0 \
                or type(until) is not int:
            continue
        done = until - 1  # the update that saw the next pass belongs to it
        if done < 2 * passes or done % passes:
            return None  # passes of unequal length, or too short to count on
        epochs = planned[1]
        if type(epochs) is not int or epochs <= passes:
            return None
        return HandLoop(epochs, done // passes, e.loc)
    return None


def _hand_loop_run(a: "Analysis", s: Schedule) -> Plan | None:
    """``planned_run`` for a loop without a DataLoader: stepped once per update (as with a
    DataLoader), or once per pass of the outer loop (every recorded step() between two passes:
    after a whole number of passes' updates, at least one after the first pass)."""
    loop = hand_loop(a)
    c = cadence(a, s) if loop is not None else None
    if c is None:
        return None
    k = typical([w.k for w in a.windows.get(s.opt, [])]) or 1
    # the pass counts every optimizer's updates: this optimizer's share of them
    mine, everyone = a.count(e for e in a.steps if e.get("opt") == s.opt), a.step_count
    per = loop.per_pass * mine / everyone if everyone else 0
    if per < 2 or abs(per - round(per)) > 0.05:
        return None  # one update a pass: the outer loop counts steps, not epochs
    per = int(round(per))
    lengths = tuple(sorted({per, per * k}))  # a length counted in updates or in batches
    per_update = (PER_UPDATE[0] <= c.per_update <= PER_UPDATE[1]
                  or 0 <= s.count - c.updates <= 1) and c.most_between <= 1 and c.updates >= 3
    acc = f" of {k} accumulated batches" if k > 1 else ""
    if per_update:
        steps = loop.epochs * per
        return Plan("batch", steps, loop.epochs, per,
                    f"{loop.epochs} epochs × {per:,} updates{acc} = {steps:,} steps", lengths,
                    per * k, None, k, hand=loop)
    before = [a.steps_before(e.seq) for e in s.steps]  # every optimizer's updates
    if mine > per and s.count <= mine // per + 1 and before \
            and all(n % loop.per_pass == 0 for n in before) and max(before) > 0:
        return Plan("epoch", loop.epochs, loop.epochs, None, f"{loop.epochs} epochs", lengths,
                    per * k, None, k, hand=loop)
    return None


@dataclass(frozen=True)
class Misfit:
    """A schedule whose length is out of scale with the planned run."""

    plan: Plan
    side: str  # "spent": done within SPENT_SHARE of the run; "still": barely begun at its end;
    # "ends": a decay to 0 sized in whole epochs of batches, fewer than the run's (lr 0 after it);
    # "micro": sized in the run's micro-batches, stepped once per accumulated update; "cycles":
    # a cosine sized in batches but shorter than half the run, which climbs back and cycles
    at: int  # spent: the scheduler step at which it has done its work; still: its length
    what: str  # what happens there, for a message
    arg: str  # the argument sized in the wrong unit
    value: object  # its value
    left: float | None  # the lr at the run's end as a share of its start, where computable
    cycles: float | None  # a cosine's full cycles over the run
    real_length: int | None = None  # still: its length in a real run (len(loader) was the replay's)
    by_updates: bool = False  # still: its length is the run's optimizer steps (Lightning's max_steps)
    accumulated: int = 1  # ends: sized in one epoch's optimizer steps of this many accumulated batches


def _gamma(args) -> float | None:
    g = args.get("gamma")
    return float(g) if isinstance(g, (int, float)) and 0 < g < 1 else None


def _spent_at(s: Schedule):
    """``(step, what, arg, value)``: the scheduler step by which the schedule has done its work
    (decayed below FLOOR of its start, reached its minimum, ended), or None."""
    args, cls = s.args, s.cls
    gamma = _gamma(args)
    if cls == "StepLR" and gamma and isinstance(args.get("step_size"), int) and args["step_size"] > 0:
        n = math.ceil(math.log(FLOOR) / math.log(gamma) - 1e-9)
        return (args["step_size"] * n, f"falls below {FLOOR:.0%} of its start", "step_size",
                args["step_size"])
    if cls == "ExponentialLR" and gamma:
        n = math.ceil(math.log(FLOOR) / math.log(gamma) - 1e-9)
        return n, f"falls below {FLOOR:.0%} of its start", "gamma", gamma
    if cls == "MultiStepLR" and gamma and args.get("milestones"):
        factor, milestones = 1.0, [m for m in args["milestones"] if isinstance(m, int) and m > 0]
        for m in milestones:
            factor *= gamma
            if factor <= FLOOR * (1 + 1e-9):
                return m, f"falls to {factor:.2g} of its start", "milestones", args["milestones"]
        if milestones:
            return (milestones[-1], f"passes its last milestone ({factor:.2g} of its start)",
                    "milestones", args["milestones"])
        return None
    if cls == "CosineAnnealingLR" and isinstance(args.get("T_max"), int) and args["T_max"] > 0:
        return args["T_max"], "reaches eta_min", "T_max", args["T_max"]
    if cls == "OneCycleLR" and isinstance(args.get("total_steps"), int) and args["total_steps"] > 0:
        return (args["total_steps"], "reaches the end of its cycle (its next step() raises "
                "torch's ValueError: \"Tried to step ... times\")", "total_steps", args["total_steps"])
    if cls in ("LinearLR", "PolynomialLR") and isinstance(args.get("total_iters"), int) \
            and args["total_iters"] > 0:
        if cls == "LinearLR":
            start, end = args.get("start_factor", 1 / 3), args.get("end_factor", 1.0)
            if not (isinstance(start, (int, float)) and isinstance(end, (int, float))) or end >= start:
                return None  # a warm-up: a short one is a choice
            what = f"ends its decay at {end / start:.2g} of its start"
        else:
            what = "ends its decay at 0"
        return args["total_iters"], what, "total_iters", args["total_iters"]
    if cls == "LambdaLR" and isinstance(args.get("num_training_steps"), int) \
            and args["num_training_steps"] > 0 and "constant" not in str(args.get("lr_lambda", "")):
        return (args["num_training_steps"], "ends its decay", "num_training_steps",
                args["num_training_steps"])
    if cls == "LambdaLR" and isinstance(args.get("lambda_end"), int) and args["lambda_end"] > 0:
        return args["lambda_end"], "reaches 0", "lr_lambda", args["lambda_end"]
    return None


def _decays_to_zero(s: Schedule) -> bool:
    """A schedule whose lr is 0 from its end on (a linear or polynomial decay, transformers'
    linear and polynomial schedules): past its length the optimizer applies no update. A decay
    to a floor (LinearLR's end_factor) or a cosine (it climbs back) is left out."""
    if s.cls == "PolynomialLR":
        return True
    if s.cls != "LambdaLR":
        return False
    if isinstance(s.args.get("lambda_end"), int):
        return True
    name = str(s.args.get("lr_lambda", ""))
    return isinstance(s.args.get("num_training_steps"), int) and ("linear" in name or "polynomial" in name)


def _ends_before_run(s: Schedule, plan: Plan, at: int, what: str, arg: str, value) -> Misfit | None:
    """A decay to 0 sized in whole epochs of batches (``len(loader)``, ``k * len(loader)``) but
    over fewer epochs than the loop around the DataLoader runs: from its end on the lr is 0, and
    every later epoch (one at least) applies no update."""
    if s.parent is not None or not plan.per_epoch or not plan.epochs or not _decays_to_zero(s):
        return None
    unit = next((n for n in plan.lengths if n >= 2 and at % n == 0), None)
    accumulated = 1
    if unit is None and plan.k > 1:
        # under accumulation over k batches, a count of one epoch's optimizer steps
        # (len(loader) // k, math.ceil(len(loader) / k)) times a number of epochs
        units = [n for length in plan.lengths for n in (length // plan.k, -(-length // plan.k))
                 if n >= 2 and at % n == 0]
        if any(at // n >= plan.epochs for n in units):
            return None  # every planned epoch of some reading of len(loader) (the replay's or
            # the real one, floor or ceil): sized over the whole run
        unit = units[0] if units else None
        accumulated = plan.k
    if unit is None:
        return None
    # a count of whole len(loader)s, in the real run's batches (the replay's loader may be
    # shorter): the scheduler steps it lasts. Not the optimizer steps of as many epochs: with
    # accumulation over k batches, len(loader) * epochs // k (accelerate's examples) is a whole
    # run of updates, not epochs // k epochs of them
    at = at // unit * (plan.per_epoch if accumulated > 1 else (plan.real_len or plan.per_epoch))
    if at >= plan.steps or plan.steps - at < plan.per_epoch:
        return None
    return Misfit(plan, "ends", at, what, arg, value, 0.0, None, accumulated=accumulated)


def _length(s: Schedule):
    """``(length, arg, value)``: the scheduler steps before a per-epoch schedule changes the lr
    much (a cosine's or linear decay's length, a StepLR's first step, a MultiStepLR's first
    milestone), or None."""
    args, cls = s.args, s.cls
    if cls == "StepLR" and _gamma(args) and isinstance(args.get("step_size"), int) and args["step_size"] > 0:
        return args["step_size"], "step_size", args["step_size"]
    if cls == "MultiStepLR" and _gamma(args) and args.get("milestones"):
        first = args["milestones"][0]
        return (first, "milestones", args["milestones"]) if isinstance(first, int) and first > 0 else None
    found = _spent_at(s)
    if found is not None and s.cls not in ("ExponentialLR",):
        return found[0], found[2], found[3]
    return None


_EPOCH_WORD = re.compile(r"epoch", re.I)
_BATCH_WORDS = re.compile(r"len\(|per_?epoch|step|iter|batch", re.I)


def _length_named_in_epochs(a: "Analysis", s: Schedule, arg: str, plan: Plan) -> bool:
    """Whether a schedule stepped per batch (``plan.per_epoch`` of them per epoch, 2 or more)
    was given its length ``arg`` (``milestones``, ``step_size``, ``T_max``) as a count of epochs
    by the script's own text: the argument reads a name saying epoch (``int(EPOCHS * 0.6)``,
    ``num_epochs // 3``) and none saying batch, step or iteration. Such a length is spent by
    the epoch it names counted in batches, whatever share of the run that is."""
    if s.init is None or s.init.loc is None or not plan.per_epoch or plan.per_epoch < 2:
        return False
    text = a.source.schedule_arguments(s.init.loc.path, s.init.loc.line, s.cls)
    if not text:
        return False
    try:
        call = ast.parse(f"f(None, {text})", mode="eval").body
    except SyntaxError:
        return False
    node = next((k.value for k in call.keywords if k.arg == arg), None)
    if node is None:
        return False
    shown = ast.unparse(node)
    return bool(_EPOCH_WORD.search(shown)) and not _BATCH_WORDS.search(shown)


def _warmup_in_epochs(a: "Analysis", s: Schedule, plan: Plan):
    """``(total_iters, its source text)`` of a ``LinearLR`` warm-up stepped per batch whose
    length the script names as epochs (``total_iters=warmup_epochs``, nothing per epoch or
    batch in it) and that ends within the first epoch; None otherwise."""
    if s.cls != "LinearLR" or s.init is None or s.init.loc is None or not plan.per_epoch:
        return None
    args = s.args
    start, end, n = args.get("start_factor", 1 / 3), args.get("end_factor", 1.0), args.get("total_iters", 5)
    if not (isinstance(start, (int, float)) and isinstance(end, (int, float)) and start < end
            and isinstance(n, int) and 0 < n < plan.per_epoch):
        return None
    text = a.source.schedule_arguments(s.init.loc.path, s.init.loc.line, "LinearLR")
    if not text:
        return None
    try:
        call = ast.parse(f"f(None, {text})", mode="eval").body
    except SyntaxError:
        return None
    node = next((k.value for k in call.keywords if k.arg == "total_iters"), None)
    if node is None and len(call.args) >= 4:
        node = call.args[3]
    if node is None:
        return None
    shown = ast.unparse(node)
    if not _EPOCH_WORD.search(shown) or _BATCH_WORDS.search(shown):
        return None
    return n, shown


MICRO_SHARE = 0.6  # a schedule sized in micro-batches covers at most this share of its length
_RUN_LENGTHS = ("total_steps", "T_max", "num_training_steps", "total_iters")


def _micro_batch_length(s: Schedule, plan: Plan) -> Misfit | None:
    """A schedule stepped once per optimizer step under accumulation of ``plan.k`` micro-batches
    whose length is the planned run counted in DataLoader batches (``epochs * len(loader)``):
    over the run it is stepped ``1/k`` as often as its length says, so it covers at most
    ``MICRO_SHARE`` of it (a decay that never finishes, a one-cycle that never comes down).
    Misfit side ``"micro"``; None otherwise."""
    if plan.k < 2 or not plan.epochs or not plan.real_len:
        return None
    for arg in _RUN_LENGTHS:
        n = s.args.get(arg)
        if type(n) is not int or n <= 0:
            continue
        if arg == "total_iters" and s.cls == "LinearLR":
            start, end = s.args.get("start_factor", 1 / 3), s.args.get("end_factor", 1.0)
            if not (isinstance(start, (int, float)) and isinstance(end, (int, float))) or end >= start:
                return None  # a warm-up, not the run's decay
        for length in (plan.replay_len, plan.real_len):
            if not length or length < 2 or n != plan.epochs * length:
                continue
            real = plan.epochs * plan.real_len  # the run's batches, as a real run counts them
            if plan.steps > MICRO_SHARE * real:
                return None
            left = lr_left(s, plan.steps * n / real)
            if s.cls == "LambdaLR" and "linear" not in str(s.args.get("lr_lambda", "")):
                left = None  # lr_left reads a LambdaLR as a linear decay
            return Misfit(plan, "micro", n, "", arg, n, left, None, real)
        return None
    return None


def _cosine_cycles(s: Schedule, plan: Plan, t_max: int) -> Misfit | None:
    """A ``CosineAnnealingLR`` stepped per batch whose ``T_max`` counts batches (a multiple of
    the epoch's) but only a part of the planned run: past ``T_max`` torch's cosine climbs back
    to its maximum, so over the run the lr swings between its maximum and ``eta_min`` at least
    one full cycle (``T_max=len(loader)`` where ``epochs * len(loader)`` was meant). Misfit side
    ``"cycles"``; None when the run ends before the lr is back at its maximum."""
    real = t_max
    if plan.replay_len and plan.real_len and plan.replay_len < plan.real_len \
            and t_max % plan.replay_len == 0:
        real = t_max // plan.replay_len * plan.real_len  # len(loader) returned the replay's length
    cycles = plan.steps / (2 * real)
    if cycles < 1:
        return None
    return Misfit(plan, "cycles", real, "reaches eta_min", "T_max", t_max,
                  lr_left(s, plan.steps * t_max / real), cycles, real)


def _sized_in_batches(n: int, lengths) -> bool:
    return any(m >= 2 and n >= m and n % m == 0 for m in lengths)


# A length written as a bare number is read as a batch count only when every value of it is a
# multiple of a pass at least this long: a multiple of a shorter pass (8 or 10 batches) is as
# likely a count of epochs that happens to divide by it (``milestones=[16, 22]`` of 8 batches).
NUMBER_PASS_MIN = 20


def _number_sized_in_batches(value, lengths) -> bool:
    values = value if isinstance(value, list) else [value]
    if not values or not all(type(v) is int and v > 0 for v in values):
        return False
    return any(m >= NUMBER_PASS_MIN and all(v >= m and v % m == 0 for v in values) for m in lengths)


def _written_as_number(a: "Analysis", s: Schedule, arg: str) -> bool:
    """Whether the script writes the schedule's length ``arg`` as integer literals
    (``step_size=20``, ``milestones=[16, 22]``, ``StepLR(opt, 30)``): nothing in its text ties it
    to the DataLoader or the run."""
    if s.init is None or s.init.loc is None:
        return False
    text = a.source.schedule_arguments(s.init.loc.path, s.init.loc.line, s.cls)
    if not text:
        return False
    try:
        call = ast.parse(f"f(None, {text})", mode="eval").body
    except SyntaxError:
        return False
    node = next((k.value for k in call.keywords if k.arg == arg), None)
    if node is None and arg in ("step_size", "milestones") and len(call.args) >= 2:
        node = call.args[1]
    if node is None:
        return False
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    return bool(items) and all(isinstance(e, ast.Constant) and type(e.value) is int for e in items)


def lr_left(s: Schedule, steps: float) -> float | None:
    """The schedule's lr after ``steps`` of its steps, as a share of its start (eta_min and
    end factors taken as 0 where that is their default)."""
    args, cls = s.args, s.cls
    gamma = _gamma(args)
    try:
        if cls == "StepLR" and gamma:
            return gamma ** (steps // args["step_size"])
        if cls == "ExponentialLR" and gamma:
            return gamma ** steps
        if cls == "MultiStepLR" and gamma:
            return gamma ** sum(1 for m in args["milestones"] if m <= steps)
        if cls == "CosineAnnealingLR":
            return 0.5 * (1 + math.cos(math.pi * steps / args["T_max"]))
        if cls in ("LinearLR", "PolynomialLR", "LambdaLR"):
            n = args.get("total_iters") or args.get("num_training_steps") or args.get("lambda_end")
            done = min(1.0, steps / n)
            if cls == "LinearLR":
                start, end = args.get("start_factor", 1 / 3), args.get("end_factor", 1.0)
                return (start + (end - start) * done) / start
            if cls == "PolynomialLR":
                return (1 - done) ** args.get("power", 1.0)
            return 1 - done
    except (KeyError, TypeError, ZeroDivisionError, OverflowError, ValueError):
        return None
    return None


def schedule_misfit(a: "Analysis", s: Schedule) -> Misfit | None:
    """A scheduler whose length is out of scale with the run the script plans, in the unit it
    is stepped in: stepped per batch, it has done its work (decayed 100x, reached its minimum,
    ended) within the first ``SPENT_SHARE`` of the run, its length not sized with the
    DataLoader's length; stepped per epoch with a length sized with the DataLoader's length
    (in batches), it covers at most ``STILL_SHARE`` of it by the run's end. None otherwise."""
    if not s.positional or s.cls in CONTAINERS or s.init is None:
        return None
    stepper, offset = s, 0  # who the user steps; where in its steps this schedule starts
    if s.parent is not None:
        stepper = a.schedulers.get(s.parent)
        if stepper is None or stepper.cls not in CONTAINERS or stepper.parent is not None \
                or stepper.init is None:
            return None
        if stepper.cls == "SequentialLR":  # judged: its last schedule, from its last milestone
            children = stepper.init.get("children") or []
            milestones = stepper.args.get("milestones") or []
            if not children or children[-1] != s.sched or len(milestones) != len(children) - 1:
                return None
            offset = milestones[-1] if milestones else 0
            if not isinstance(offset, int) or offset < 0:
                return None
    if not stepper.count:
        return None
    if s.cls == "LambdaLR" and "lambda_end" not in s.args:
        end = lambda_decay_end(a, s)
        if end is not None:
            s = replace(s, args={**s.args, "lambda_end": end})
    args = s.args
    if isinstance(args.get("last_epoch"), int) and args["last_epoch"] > 0 and s.parent is None:
        return None  # resumed: its position is not the run's start
    if per_micro_batch(a, stepper) is not None or stepped_twice(a, stepper) is not None:
        return None  # scheduler-per-micro-batch / scheduler-stepped-twice say it
    plan = planned_run(a, stepper)
    if plan is None:
        return None
    if plan.unit == "batch" and s.parent is None:
        micro = _micro_batch_length(s, plan)
        if micro is not None:
            return micro
    if plan.unit == "batch":
        found = _spent_at(s)
        if found is None:
            warm = _warmup_in_epochs(a, s, plan)
            if warm is not None:
                return Misfit(plan, "spent", warm[0] + offset, "ends its warm-up", "total_iters",
                              warm[1], None, None)
            return None
        at, what, arg, value = found
        at += offset
        sizes = value if isinstance(value, list) else [value] if isinstance(value, int) else []
        if s.cls == "CosineAnnealingLR" and s.parent is None and sizes \
                and _sized_in_batches(sizes[0], plan.lengths):
            return _cosine_cycles(s, plan, sizes[0])
        named = at <= (plan.epochs or 0) and _length_named_in_epochs(a, s, arg, plan)
        if any(_sized_in_batches(v, plan.lengths) for v in sizes) and not named:
            return _ends_before_run(s, plan, at, what, arg, value)  # a batch count: of the run?
        if plan.k > 1 and not named:  # a count of one epoch's updates: of the run?
            ends = _ends_before_run(s, plan, at, what, arg, value)
            if ends is not None:
                return ends
        if at > SPENT_SHARE * plan.steps and not named:
            return None
        if plan.per_epoch and at >= plan.per_epoch and plan.epochs and plan.epochs < 2 / SPENT_SHARE \
                and not named:
            return None  # a short run (under 20 epochs) whose schedule outlasts the first epoch
        cycles = (plan.steps - offset) / (2 * (at - offset)) if s.cls == "CosineAnnealingLR" else None
        return Misfit(plan, "spent", at, what, arg, value, lr_left(s, plan.steps - offset), cycles)
    if s.parent is not None:
        return None  # a container stepped per epoch: its children's lengths are not judged
    found = _length(s)
    if found is None:
        return None
    n, arg, value = found
    by_updates = plan.updates is not None and n == plan.updates
    if not _sized_in_batches(n, plan.lengths) and not by_updates:
        return None
    if not by_updates and _written_as_number(a, s, arg) \
            and not _number_sized_in_batches(value, plan.lengths):
        return None  # a bare count of epochs that happens to divide by a short pass
    real = n
    if plan.replay_len and plan.real_len and plan.replay_len < plan.real_len \
            and n % plan.replay_len == 0:
        real = n // plan.replay_len * plan.real_len  # len(loader) returned the replay's length
    if by_updates:
        real = n  # the run's optimizer steps, not a multiple of len(loader)
    if plan.steps > STILL_SHARE * real:
        return None
    return Misfit(plan, "still", n, "", arg, value, lr_left(s, plan.steps * n / real), None, real,
                  by_updates)
