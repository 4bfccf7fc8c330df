"""The gradient ledger (DESIGN §3): replays a trace and keeps, for every parameter, the
contributions in its ``.grad`` since it was last cleared.

A *phase* is a maximal run of backward calls followed by the optimizer steps after them; the
next backward opens a new phase. From that the ledger derives two kinds of observations that
the zero_grad rules turn into findings:

* ``OldUse``   — a step consumed a contribution from an earlier phase (missing / partial
  zero_grad, stale gradient);
* ``Discard``  — a clear dropped contributions no step had consumed, and a later step of the
  same phase would have used them (misplaced zero_grad).

Pure Python over ``Trace``; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .trace import Event, Trace


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


@dataclass
class Ledger:
    old_uses: list[OldUse] = field(default_factory=list)
    discards: list[Discard] = field(default_factory=list)  # confirmed: later_step is set
    owners: dict[int, set[int]] = field(default_factory=dict)  # pid -> optimizer ids
    opt_params: dict[int, list[int]] = field(default_factory=dict)
    optimizer_events: dict[int, Event] = field(default_factory=dict)  # opt -> first optimizer_init
    first_contribution: dict[int, Event] = field(default_factory=dict)  # pid -> first backward
    steps: list[Event] = field(default_factory=list)
    backward_count: int = 0
    windows: dict[int, list[Event]] = field(default_factory=dict)  # step seq -> backwards it consumed


def build_ledger(trace: Trace) -> Ledger:
    led = Ledger()
    contribs: dict[int, list[Contribution]] = {}
    clears: list[Event] = []
    pending: list[Discard] = []
    phase = 0
    stepped_in_phase = True  # so the first backward opens phase 1
    in_closure = False  # between step_begin(closure) and its step: L-BFGS re-evaluations
    last_epoch_start = -1  # seq of the latest DataLoader epoch_start

    for e in trace:
        kind = e.kind
        if kind == "epoch_start":
            last_epoch_start = e.seq
            # a partial window dropped by a clear right before a new epoch begins (zero_grad at
            # the top of the epoch) is the end of an epoch, not a misplaced clear
            pending = [d for d in pending if d.followed]
            continue
        if kind == "optimizer_init":
            opt = e["opt"]
            led.optimizer_events.setdefault(opt, e)
            led.opt_params.setdefault(opt, []).extend(e["params"])
            for pid in e["params"]:
                led.owners.setdefault(pid, set()).add(opt)
        elif kind == "backward":
            led.backward_count += 1
            if stepped_in_phase:
                phase += 1
                stepped_in_phase = False
                pending = []  # a clear after the last step of a phase is where clears belong
            for d in pending:
                d.followed = True
            for pid in e.get("cleared_outside", ()):
                contribs[pid] = []
            for pid in e.get("fresh", ()):
                contribs[pid] = []  # a cleared .grad: whatever we had was dropped outside zero_grad
            for pid in (*e.get("fresh", ()), *e.get("accumulated", ()), *e.get("cleared_outside", ())):
                contribs.setdefault(pid, []).append(Contribution(e, phase))
                led.first_contribution.setdefault(pid, e)
        elif kind == "clear":
            clears.append(e)
            for pid in e["params"]:
                dropped = contribs.get(pid) or []
                unused = [c for c in dropped if not c.consumed_by and c.phase == phase
                          and not c.purposeful and c.backward.seq > last_epoch_start]
                if unused and not in_closure:
                    pending.append(Discard(e, pid, unused, phase))
                contribs[pid] = []
        elif kind == "step_begin":
            in_closure = bool(e.get("closure"))
        elif kind == "step":
            in_closure = False
            stepped_in_phase = True
            led.steps.append(e)
            index = len(led.steps)
            opt = e["opt"]
            consumed: dict[int, Event] = {}
            for d in pending:
                d.followed = True
                if d.later_step is None and opt in led.owners.get(d.pid, ()):
                    d.later_step, d.later_step_index = e, index
                    led.discards.append(d)
            for pid in led.opt_params.get(opt, ()):
                cs = contribs.get(pid)
                if not cs:
                    continue
                old = [c for c in cs if c.phase < phase]
                if old:
                    since = old[0].backward.seq
                    mine = set(led.opt_params.get(opt, ()))
                    between = [c for c in clears if c.seq > since and mine.intersection(c["params"])]
                    led.old_uses.append(OldUse(e, index, opt, pid, phase, old,
                                               [c for c in cs if c.phase == phase], between))
                for c in cs:
                    c.consumed_by.append(e)
                    consumed.setdefault(c.backward.seq, c.backward)
            led.windows[e.seq] = [consumed[seq] for seq in sorted(consumed)]
    return led


def ledger_of(trace: Trace) -> Ledger:
    """The ledger of a trace, built once and shared by the rules."""
    cached = getattr(trace, "_ledger", None)
    if cached is None or cached[0] != len(trace):
        cached = (len(trace), build_ledger(trace))
        trace._ledger = cached  # type: ignore[attr-defined]
    return cached[1]
