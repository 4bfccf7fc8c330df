"""The gradient ledger (docs/architecture.md, "The gradient ledger"): replays a trace and
keeps, for every parameter, the contributions in its ``.grad`` since it was last cleared.

A *phase* is a maximal run of backward calls followed by the optimizer steps after them; the
next backward opens a new phase. From that the ledger derives two kinds of observations that
the zero_grad rules turn into findings:

* ``OldUse``   — a step consumed a contribution from an earlier phase (missing / partial
  zero_grad, stale gradient);
* ``Discard``  — a clear dropped contributions no step had consumed, and a later step of the
  same phase would have used them (misplaced zero_grad).

It also keeps, in the same single pass, each phase's backwards, the parameters they wrote and
the steps after them (``Phase``: crossed optimizers read them), the steps that applied scaled gradients nothing
unscaled (``ScaledStep``), what the clip rules need to know about the gradients a
clip touches (``ClipState``: unused contributions, the step that already applied them, scaled
gradients not yet unscaled) and which clipped gradients a later backward added to
(``ClipOverwrite``), so no rule replays backward/clear/step again.

Pure Python over the ``Analysis``; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from ..trace import Event

if TYPE_CHECKING:
    from . import Analysis


@dataclass(eq=False)
class Contribution:
    backward: Event
    phase: int
    consumed_by: list[Event] = field(default_factory=list)

    @property
    def purposeful(self) -> bool:
        """The backward had a purpose beyond the parameters' update: it wrote non-parameter
        leaves (FGSM's input gradient) or ran inside ``optimizer.step(closure)`` (L-BFGS)."""
        return bool(self.backward.get("extra_leaves")) or self.backward.get("in_step") is not None


@dataclass(eq=False)
class OldUse:
    """``step`` (phase ``phase``) applied contributions ``old`` from earlier phases to ``pid``."""

    step: Event
    step_index: int
    opt: int
    pid: int
    phase: int
    old: list[Contribution]
    fresh: list[Contribution]
    clears_between: list[Event]  # clears of some of the optimizer's params since ``old[0]``


@dataclass(eq=False)
class Discard:
    clear: Event
    pid: int
    contributions: list[Contribution]
    phase: int
    later_step: Event | None = None  # the step of the same phase that would have used them
    later_step_index: int | None = None
    followed: bool = False  # a backward or step came after the clear


@dataclass(eq=False)
class ClipState:
    """The gradients a clip (one that clips: not ``norm_only``) touched, as the ledger saw them."""

    clip: Event
    owned: list[int]  # its tracked params some optimizer owns
    unused: set[int]  # owned params holding contributions no step has used yet
    used_by: dict[int, Event]  # owned param -> the step that already applied its latest gradient
    scaled: dict[int, Event]  # param -> the scaled backward whose gradient is not unscaled yet


@dataclass(eq=False)
class ClipOverwrite:
    """A backward added to gradients that ``clip`` had clipped, before any step used them."""

    clip: Event
    backward: Event
    pids: list[int]


@dataclass(eq=False)
class ScaledStep:
    """A step that applied gradients of a scaled backward that nothing unscaled: ``pids`` ->
    that backward; ``edited``: those of them changed in place by unwatched code since (a
    hand-written unscale, or a hand-written clip)."""

    step: Event
    scaled: dict[int, Event]
    edited: set[int]


@dataclass(eq=False)
class MixedUnscale:
    """An ``unscale`` (explicit, or inside ``scaler.step``) divided gradients that hold both an
    enabled scaler's scaled contribution and ``plain`` ones of backwards without
    ``scaler.scale``: ``pid`` -> the first such plain backward."""

    unscale: Event
    plain: dict[int, Event]
    scaled: Event  # a scaled backward in the same gradients


@dataclass(eq=False)
class Phase:
    """One phase of one thread's loop: the parameters its backwards wrote and the steps after
    them (closure steps included; a step before any backward belongs to no phase)."""

    number: int
    thread: int | None
    backwards: list[Event] = field(default_factory=list)
    written: set[int] = field(default_factory=set)
    steps: list[Event] = field(default_factory=list)


@dataclass
class Ledger:
    old_uses: list[OldUse] = field(default_factory=list)
    discards: list[Discard] = field(default_factory=list)  # confirmed: later_step is set
    first_contribution: dict[int, Event] = field(default_factory=dict)  # pid -> first backward
    # step seq -> the backwards whose gradients it applied for the first time (its accumulation
    # window; gradients applied again are the missing zero_grad's, not a larger window)
    windows: dict[int, list[Event]] = field(default_factory=dict)
    clips: list[ClipState] = field(default_factory=list)
    clip_overwrites: list[ClipOverwrite] = field(default_factory=list)
    scaled_steps: list[ScaledStep] = field(default_factory=list)
    mixed_unscales: list[MixedUnscale] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)  # in the order they opened, every thread's


class _Loop:
    """Where one thread's training loop is (a script that trains in threads runs one per
    thread; their calls interleave in the trace, their phases do not mix)."""

    __slots__ = ("phase", "stepped_in_phase", "pending", "in_closure", "evaluations", "record")

    def __init__(self) -> None:
        self.phase = 0
        self.stepped_in_phase = True  # so the first backward opens a phase
        self.pending: list[Discard] = []
        self.in_closure = False  # between step_begin(closure) and its step: L-BFGS re-evaluations
        self.evaluations = 0  # closure evaluations (backwards) so far inside the running step(closure)
        self.record: Phase | None = None  # the phase this loop is in, as ``Ledger.phases`` holds it


def _replaced_before(a: "Analysis", opt: int, seq: int) -> bool:
    new = a.replaced.get(opt)
    return new is not None and new.seq < seq


def build_ledger(a: "Analysis") -> Ledger:
    led = Ledger()
    # who owns what *so far*: a param group added mid-run is not stepped before it is added
    owners: dict[int, set[int]] = {}
    opt_params: dict[int, list[int]] = {}
    contribs: dict[int, list[Contribution]] = {}
    clears: list[Event] = []
    loops: dict = {}  # the event's ``thread`` (None: the script's own thread) -> its _Loop
    phases = 0  # phases opened so far, in every thread: each phase gets its own number
    last_epoch_start = -1  # seq of the latest DataLoader epoch_start
    # for the clip rules
    used_by: dict[int, Event] = {}  # pid -> the step that used its latest gradient
    scaled: dict[int, Event] = {}  # pid -> the scaled backward whose grads are not unscaled yet
    clipped: dict[int, Event] = {}  # pid -> the clip whose result a later backward may add to
    scaled_edited: set[int] = set()  # scaled pids whose grads unwatched code changed in place since

    for e in a.events:
        kind = e.kind
        loop = None
        if kind in ("backward", "clear", "step_begin", "step"):
            thread = e.get("thread")
            loop = loops.get(thread)
            if loop is None:
                loop = loops[thread] = _Loop()
        if kind == "optimizer_init":
            opt_params.setdefault(e["opt"], []).extend(e["params"])
            for pid in e["params"]:
                owners.setdefault(pid, set()).add(e["opt"])
        elif kind == "epoch_start":
            last_epoch_start = e.seq
            # a partial window dropped by a clear right before a new epoch begins (zero_grad at
            # the top of the epoch) is the end of an epoch, not a misplaced clear
            for each in loops.values():
                each.pending = [d for d in each.pending if d.followed]
        elif kind == "backward":
            if loop.in_closure and e.get("in_step") is not None:
                # every closure evaluation is its own phase: L-BFGS needs the gradient at the
                # point it evaluates, so one that adds onto the previous evaluation's is stale
                if loop.evaluations and not loop.stepped_in_phase:
                    phases += 1
                    loop.phase = phases
                loop.evaluations += 1
            if loop.stepped_in_phase:
                phases += 1
                loop.phase = phases
                loop.stepped_in_phase = False
                loop.pending = []  # a clear after the last step of a phase is where clears belong
            phase = loop.phase
            for d in loop.pending:
                d.followed = True
            fresh, accumulated = e.get("fresh", ()), e.get("accumulated", ())
            outside = e.get("cleared_outside", ())
            if loop.record is None or loop.record.number != phase:
                loop.record = Phase(phase, e.get("thread"))
                led.phases.append(loop.record)
            loop.record.backwards.append(e)
            loop.record.written.update(fresh, accumulated, outside)
            for pid in outside:
                contribs[pid] = []
            for pid in e.get("rescaled", ()):
                # a grad the script rescaled in place after a step applied it (``p.grad *= mom``:
                # momentum by hand) is a sum it keeps on purpose, not one nothing cleared
                contribs[pid] = [c for c in contribs.get(pid, ()) if not c.consumed_by]
            for pid in fresh:
                contribs[pid] = []  # a cleared .grad: whatever we had was dropped outside zero_grad
            hits: dict[int, tuple[Event, list[int]]] = {}
            for pid in accumulated:
                clip = clipped.pop(pid, None)
                if clip is not None:
                    hits.setdefault(clip.seq, (clip, []))[1].append(pid)
            led.clip_overwrites.extend(ClipOverwrite(clip, e, sorted(pids)) for clip, pids in hits.values())
            for pid in (*fresh, *outside):
                clipped.pop(pid, None)
            is_scaled = bool(e.get("scaled"))
            for pid in (*fresh, *accumulated, *outside):
                contribs.setdefault(pid, []).append(Contribution(e, phase))
                led.first_contribution.setdefault(pid, e)
                used_by.pop(pid, None)
                if is_scaled:
                    scaled[pid] = e
                    scaled_edited.discard(pid)
            if not is_scaled:  # an unscaled gradient added onto a scaled one is still scaled
                for pid in (*fresh, *outside):
                    scaled.pop(pid, None)
        elif kind == "grad_edit":
            scaled_edited.update(pid for pid in e["params"] if pid in scaled)
        elif kind == "clear":
            clears.append(e)
            for pid in e["params"]:
                dropped = contribs.get(pid) or []
                unused = [c for c in dropped if not c.consumed_by and c.phase == loop.phase
                          and not c.purposeful and c.backward.seq > last_epoch_start]
                if unused and not loop.in_closure:
                    loop.pending.append(Discard(e, pid, unused, loop.phase))
                contribs[pid] = []
                scaled.pop(pid, None)
                clipped.pop(pid, None)
        elif kind == "unscale":
            plain: dict[int, Event] = {}
            scaled_one = None
            for pid in a.opt_params.get(e.get("opt"), ()):
                scaled.pop(pid, None)
                if e.get("enabled"):
                    pending = [c.backward for c in contribs.get(pid, ())
                               if not c.consumed_by and not c.purposeful]
                    on = next((b for b in pending if b.get("scaled") and b.get("scaler_enabled") is True), None)
                    off = next((b for b in pending if not b.get("scaled")), None)
                    if on is not None and off is not None:
                        plain[pid] = off
                        scaled_one = scaled_one or on
            if plain:
                led.mixed_unscales.append(MixedUnscale(e, plain, scaled_one))
        elif kind == "clip" and not e.get("norm_only"):
            scaled_edited.update(pid for pid in e.get("edited", ()) if pid in scaled)
            # owned by an optimizer that still steps: one replaced since (rebuilt over other
            # parameters) no longer applies these gradients (param-not-in-optimizer says so)
            owned = [pid for pid in e["params"] if pid in a.owners
                     and not all(_replaced_before(a, opt, e.seq) for opt in a.owners[pid])]
            led.clips.append(ClipState(
                e, owned,
                unused={pid for pid in owned if any(not c.consumed_by for c in contribs.get(pid, ()))},
                used_by={pid: used_by[pid] for pid in owned if pid in used_by},
                scaled={pid: scaled[pid] for pid in e["params"] if pid in scaled},
            ))
            for pid in owned:
                clipped[pid] = e
        elif kind == "step_begin":
            loop.in_closure = bool(e.get("closure"))
            loop.evaluations = 0
        elif kind == "step":
            loop.in_closure = False
            loop.stepped_in_phase = True
            if loop.record is not None:
                loop.record.steps.append(e)
            phase = loop.phase
            index = a.step_number[e.seq]
            opt = e["opt"]
            consumed: dict[int, Event] = {}
            for d in loop.pending:
                d.followed = True
                if d.later_step is None and opt in owners.get(d.pid, ()):
                    d.later_step, d.later_step_index = e, index
                    led.discards.append(d)
            without = e.get("without_grad") or ()
            still = {pid: scaled[pid] for pid in a.opt_params.get(opt, ())
                     if pid in scaled and pid not in without}
            if still and not e.get("skipped") and not e.get("closure"):
                led.scaled_steps.append(ScaledStep(e, still, scaled_edited & still.keys()))
            for pid in a.opt_params.get(opt, ()):
                scaled.pop(pid, None)
                clipped.pop(pid, None)
                if any(not c.consumed_by for c in contribs.get(pid, ())):
                    used_by[pid] = e
            mine = opt_params.get(opt, ())
            for pid in mine:
                cs = contribs.get(pid)
                if not cs:
                    continue
                old = [c for c in cs if c.phase < phase]
                if old:
                    since = old[0].backward.seq
                    between = [c for c in clears if c.seq > since and set(mine).intersection(c["params"])]
                    led.old_uses.append(OldUse(e, index, opt, pid, phase, old,
                                               [c for c in cs if c.phase == phase], between))
                for c in cs:
                    if not c.consumed_by:  # a window holds what a step applies for the first time;
                        consumed.setdefault(c.backward.seq, c.backward)  # re-applied: missing zero_grad
                    c.consumed_by.append(e)
            led.windows[e.seq] = [consumed[seq] for seq in sorted(consumed)]
    return led
