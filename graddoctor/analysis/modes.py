"""The mode timeline: replays ``mode_*`` events of a trace for the train/eval-mode rules.

For every aggregated BatchNorm/dropout forward (``mode_forward``) it resolves what the rules need:
the facts of each module at that time (``mode_module``), the ``train()``/``eval()`` call that last
set each module's mode (``train`` / ``eval`` events), whether the forward was a deliberate recalibration
(inside ``update_bn``, or after ``reset_running_stats()`` with no optimizer step since), and its
*context*:

* ``training`` — part of an update: the next boundary (backward, step, epoch start, recalibration,
  end of run) is a backward, or it ran between a backward and its step;
* ``outside`` — no backward follows before the next step / epoch start / the end of a completed
  run, or it is one of several no-grad calls in a row with no backward between them
  (a validation loop) — unless it ran inside a grad-enabled outermost call (``nested``: targets
  made within the training forward, MoCo's key encoder), which takes that call's context;
* ``unknown`` — the replay was cut (step budget, timeout) before anything told.

Pure Python over the ``Analysis``; no torch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..events import ASIDE_KINDS
from ..trace import Event

from .basics import listing

if TYPE_CHECKING:
    from . import Analysis

BOUNDARIES = ("backward", "step", "epoch_start", "update_bn", "run_end")
MODE_SETS = ("train", "eval")


@dataclass(eq=False)
class ModeForward:
    event: Event
    states: dict[int, dict]  # mid -> mode_module data at that time
    set_by: dict[int, Event | None]  # mid -> the train/eval event that last covered it
    recalibrated: set[int]  # mids being recalibrated (update_bn, reset_running_stats since the last step)
    context: str  # training | outside | unknown
    step: Event | None = None  # the step that closes the update (context training)
    step_index: int | None = None
    steps_before: int = 0  # optimizer steps seen before this forward

    @property
    def training(self) -> bool:
        return bool(self.event.get("training"))

    @property
    def grad(self) -> bool:
        return bool(self.event.get("grad")) and not self.event.get("inference")

    @property
    def modules(self) -> list[int]:
        return list(self.event.get("modules", ()))

    @property
    def grad_modules(self) -> set[int]:
        return set(self.event.get("grad_modules", ()))


@dataclass
class ModeTimeline:
    forwards: list[ModeForward] = field(default_factory=list)
    final_states: dict[int, dict] = field(default_factory=dict)  # mid -> last mode_module data
    ever_trainable: set[int] = field(default_factory=set)  # mids with trainable params at some point
    evaluated: set[int] = field(default_factory=set)  # mids some eval() call covered during the run
    # two optimizers take turns, each stepped after its own backward (a GAN's D and G updates)
    adversarial: bool = False

    def name(self, mid: int) -> str:
        return (self.final_states.get(mid) or {}).get("name") or f"layer#{mid}"

    def names(self, mids, limit: int = 3) -> str:
        return listing((self.name(m) for m in dict.fromkeys(mids)), limit)


def _next_boundaries(events: list[Event]):
    """For each index: the first boundary event after it, the first step after it, and the first
    ``train()`` call after it."""
    n = len(events)
    nxt: list[Event | None] = [None] * n
    nxt_step: list[Event | None] = [None] * n
    nxt_train: list[Event | None] = [None] * n
    boundary = step = train = None
    for i in range(n - 1, -1, -1):
        nxt[i], nxt_step[i], nxt_train[i] = boundary, step, train
        e = events[i]
        if e.kind in BOUNDARIES:
            boundary = e
        if e.kind == "step":
            step = e
        if e.kind == "train" and e.get("mode", True):
            train = e
    return nxt, nxt_step, nxt_train


def build_timeline(a: "Analysis") -> ModeTimeline:
    events = a.events
    tl = ModeTimeline()
    if not a.by_kind.get("mode_forward"):
        return tl
    nxt, nxt_step, nxt_train = _next_boundaries(events)
    # layers whose values some code other than an optimizer changed (an EMA / momentum teacher)
    by_hand = {e["mid"] for e in a.by_kind.get("mode_module", ()) if e.get("updated")}
    states: dict[int, dict] = {}
    set_by: dict[int, Event] = {}
    reset_since_step: set[int] = set()
    prev_boundary: Event | None = None
    pending: list[tuple[int, Event, Event | None]] = []  # forwards whose window is still open
    # the training-mode forwards, in order: whether layers ran again in training mode
    trained = [(e.seq, e.get("modules", ())) for e in a.by_kind.get("mode_forward", ())
               if e.get("training")]
    trained_seqs = [seq for seq, _ in trained]

    def rerun(start: int, end: int, mids) -> bool:
        mids = set(mids)
        i = bisect.bisect_right(trained_seqs, start)
        while i < len(trained) and trained[i][0] < end:
            if mids & set(trained[i][1]):
                return True
            i += 1
        return False

    def resolve() -> None:
        for i, e, before in pending:
            mids = list(e.get("modules", ()))
            recal = set(reset_since_step) & set(mids)
            if e.get("recalibrating"):
                recal = set(mids)
            recal |= {m for m in mids if (states.get(m) or {}).get("layer") == "batchnorm"
                      and states.get(m, {}).get("momentum") is None}
            context, step = _context(e, before, nxt[i], nxt_step[i], nxt_train[i],
                                     teacher=bool(mids) and all(m in by_hand for m in mids),
                                     rerun=rerun)
            tl.forwards.append(ModeForward(
                e, {m: states.get(m, {}) for m in mids}, {m: set_by.get(m) for m in mids}, recal,
                context, step, a.step_number.get(step.seq) if step is not None else None,
                a.steps_before(e.seq),
            ))
        pending.clear()

    for i, e in enumerate(events):
        kind = e.kind
        if kind == "mode_module":
            states[e["mid"]] = dict(e.data)
            tl.final_states[e["mid"]] = dict(e.data)
            if e.get("trainable"):
                tl.ever_trainable.add(e["mid"])
            continue
        if kind == "mode_forward":
            pending.append((i, e, prev_boundary))
            continue
        if kind in ASIDE_KINDS:  # observed inside a forward: its window is still open
            continue
        resolve()  # any other event closes the aggregation window
        if kind in MODE_SETS:
            for mid in e.get("modules", ()):
                set_by[mid] = e
            if kind == "eval":
                tl.evaluated.update(e.get("modules", ()))
        elif kind == "bn_reset":
            reset_since_step.update(e.get("modules", ()))
        elif kind == "step":
            reset_since_step.clear()
        if kind in BOUNDARIES:
            prev_boundary = e
    resolve()
    tl.adversarial = _alternating_optimizers(events)
    return tl


def _alternating_optimizers(events: list[Event]) -> bool:
    """Two updates in turn with disjoint optimizers, each opened by its own backward, and the
    first one again after them (A, B, A): a GAN's discriminator and generator updates (any
    number of D updates per G update). One loss stepped by two optimizers is one phase, not
    this."""
    phases: list[frozenset] = []
    opts: set = set()
    stepped = False
    for e in events:
        if e.kind == "backward":
            if stepped:
                phases.append(frozenset(opts))
                opts, stepped = set(), False
        elif e.kind == "step":
            opts.add(e.get("opt"))
            stepped = True
    if stepped:
        phases.append(frozenset(opts))
    return any(a and b and not (a & b) and c == a for a, b, c in zip(phases, phases[1:], phases[2:]))


def _context(e: Event, before: Event | None, after: Event | None, step: Event | None,
             train: Event | None = None, teacher: bool = False, rerun=lambda start, end, mids: True):
    grad = bool(e.get("grad")) and not e.get("inference")
    if e.get("nested"):
        # no-grad forwards inside a grad-enabled outermost call (MoCo's key encoder making the
        # targets in the training forward): part of that forward, whatever follows them
        grad = True
    cut = after is None or (after.kind == "run_end" and after.get("status") != "completed")
    if not grad and teacher and cut:
        return "unknown", None  # an EMA teacher's views, and the replay ended before the backward
    if not grad and teacher and after is not None and after.kind == "backward":
        # an EMA teacher's layers run once per view (`[teacher(v) for v in views]`) and a
        # backward follows: the loss's targets, not a validation loop
        pass
    elif not grad and e.get("calls", 1) >= 2:
        return "outside", None  # a loop of no-grad calls with no backward between them
    if not grad and train is not None and (after is None or train.seq < after.seq):
        return "outside", None  # model.train() comes next: that no-grad pass was not training
    if grad and train is not None and after is not None and after.kind == "backward" \
            and train.seq < after.seq and set(e.get("modules", ())) <= set(train.get("modules", ())) \
            and rerun(train.seq, after.seq, e.get("modules", ())):
        # model.train() switches these layers back and they run again in training mode before
        # the next backward: a grad-enabled pass in eval mode that feeds an input gradient (a
        # PGD attack under model.eval(), through torch.autograd.grad), not the update's
        # training forward. Without that second forward the backward reads this one.
        return "outside", None
    if after is not None and after.kind == "backward":
        return "training", step
    if before is not None and before.kind == "backward" and after is not None and after.kind == "step":
        return "training", after
    if cut:
        return "unknown", None
    return "outside", None


@dataclass(eq=False)
class EvaluationBackward:
    """A backward of a pass run in eval mode that is not the update's: after it, ``train()``
    switches those layers back and the update's own training backward runs before its step."""

    forward: ModeForward  # the grad-enabled forward in eval mode
    backward: Event  # its backward
    train: Event  # the train() call after it
    training_backward: Event  # the update's own backward, after that train()
    step: Event  # the step that closes the update

    @property
    def purposeful(self) -> bool:
        """The backward computes an input's gradient (an adversarial attack run in eval mode,
        PGD's ``delta.grad``): the point of that pass, not a validation loop's mistake."""
        return bool(self.backward.get("extra_leaves"))


def evaluation_backward(a: "Analysis", f: ModeForward) -> EvaluationBackward | None:
    """``f``'s backward when it belongs to a pass run in eval mode before the update (a
    validation loop that calls ``backward()``, an attack): ``f`` runs grad-enabled in eval mode,
    a backward follows, then a ``train()`` covering the layers it ran and another backward
    before the step that closes the update. None otherwise."""
    if f.training or not f.grad or f.context != "training" or f.step is None:
        return None
    after = a.span(f.event.seq + 1, f.step.seq - 1)
    backward = next((e for e in after if e.kind == "backward"), None)
    if backward is None or backward.get("in_step") is not None:
        return None
    ran = set(f.modules)
    train = next((e for e in after if e.kind == "train" and e.seq > backward.seq
                  and e.get("mode", True) and ran <= set(e.get("modules", ()))), None)
    if train is None:
        return None
    again = next((e for e in after if e.kind == "backward" and e.seq > train.seq), None)
    if again is None:
        return None
    return EvaluationBackward(f, backward, train, again, f.step)
