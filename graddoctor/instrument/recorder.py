"""The recorder: shared state of one instrumented run.

Every hook and wrapper writes through it. It owns the trace, numbers tensors (pids),
remembers what each parameter's ``.grad`` looked like when graddoctor last saw it, and
turns its own failures into ``internal_error`` events instead of exceptions.

Events are final when emitted (``Event.data`` is read-only):

* A watcher whose events may still grow (the mode watcher's aggregates) holds them back as the
  recorder's ``holder``: ``emit`` has it emit them, finished and in order, before any other
  event, and ``finish`` at the end of the run. ``snapshot`` shows them as they are now.
* Device values recorded without a host sync stay ``Deferred`` in the trace; ``finish`` swaps
  the trace for its final form, a new ``Trace`` in which the events that held one are new
  ``Event`` objects holding the value. A snapshot taken before shows them unread.
"""

from __future__ import annotations

import operator
import threading
import traceback
from itertools import compress, repeat
from operator import is_, is_not
from threading import get_ident
from typing import Any, Callable

import torch

from .. import events as ev
from ..events import THREADED_KINDS
from ..location import LocationFinder
from ..trace import Event, Location, Trace
from .fold import Folder
from .identities import Identities
from .stop import StopCondition, StopReplay, conditions


# What watchers tell each other, in one place: topic -> who publishes it and what its
# subscribers are called with (``Recorder.subscribe``). The publisher loops over the list
# ``Recorder.subscribers`` gave it at construction: no extra call per event.
TOPICS = {
    "params_added": "OptimizerWatcher: (opt, pids) after an optimizer was given a param group",
    "stepped": "OptimizerWatcher: (opt, optimizer) after each real optimizer step",
    "step_grads": "OptimizerWatcher: (opt, optimizer, by_device, norm_pids, norms) before each "
                  "optimizer step that is not a closure step: its dense gradients by device "
                  "{device: ([pid], [grad])} and their norms when it measured them (else None)",
    "stepped_without_grad": "OptimizerWatcher: (opt, pids) after each real optimizer step, "
                            "its parameters that had no gradient",
    "describe_loss": "BackwardWatcher: (tensors) -> dict of keyword arguments of "
                     "events.backward for the backward about to run from them",
    "leaf_tracked": "BackwardWatcher: () after a leaf that is no parameter was first tracked (one "
                    "that lives across backwards: a learnable tensor made with requires_grad=True)",
    "freeze_of": "OptimizerWatcher: (param) -> seq of the event that froze it, or None",
    "counted_step": "Recorder.count_step: (updates) after each optimizer step is counted, "
                    "before its listeners (the progress line: updates, what the budget counts)",
    "budget_hold": "Recorder.holds: () -> True while the replay should go on past the step "
                   "budget (e.g. until a DataLoader has crossed two epoch boundaries); each "
                   "must bound itself",
}

_DUMMY_THREAD = getattr(threading, "_DummyThread", ())  # a thread Python did not start


def _shape(tensor) -> list[int] | None:
    """The shape, or None for a lazy module's UninitializedParameter (no shape until its first
    forward; the end-of-run ``param`` event reads it again)."""
    try:
        return list(tensor.shape)
    except RuntimeError:
        return None


Tensor = torch.Tensor

# Passes over every tracked tensor run each step: they are written as ``map``s over C
# functions (attribute getters, identity tests, ``itertools.compress``), so that their cost per
# tensor is a few C calls, not Python bytecode, and they allocate no container per tensor.
call = getattr(operator, "call", None) or operator.methodcaller("__call__")  # a weak ref's object
_version = operator.attrgetter("_version")
_requires_grad = operator.attrgetter("requires_grad")
_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def tensors_of(refs: list, pids: list) -> list:
    """The tracked tensors ``pids`` (None for one that died), from ``Identities.refs``."""
    return list(map(call, map(refs.__getitem__, pids)))


def grads_of(tensors: list) -> list:
    """Each tensor's ``.grad`` (None for a tensor that is None)."""
    return list(map(getattr, tensors, repeat("grad"), repeat(None)))


def states_of(grads: list):
    """``(id(grad), version)`` of each grad (none None), lazily (``version``: a DTensor's local
    shard's)."""
    if all(map(is_, map(type, grads), repeat(Tensor))):
        return zip(map(id, grads), map(_version, grads))
    return zip(map(id, grads), map(version, grads))


def local(grad):
    """A ``DTensor``'s local shard (FSDP2, tensor parallelism: the reduce-scatter writes a
    sharded gradient in place into it, and reading it needs no communication); any other
    tensor itself. Hot loops test ``type(grad) is Tensor`` first and call this only otherwise."""
    return getattr(grad, "_local_tensor", grad)


def version(grad) -> int:
    """A gradient's data version: a DTensor's wrapper keeps its version when FSDP adds into its
    local shard, so the shard's is read."""
    return grad._version if type(grad) is Tensor else local(grad)._version


class Deferred:
    """A device scalar recorded without a host sync; ``Recorder.finish`` reads it at the end."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __repr__(self) -> str:  # a provisional report written mid-run shows it unread
        return "unread"

    def value(self) -> float | None:
        try:
            return float(self.tensor.item())
        except Exception:
            return None


def resolved(trace: Trace) -> Trace:
    """A new trace with the values of the ``Deferred`` device values in ``trace``: the events
    that hold one are new ``Event`` objects (same seq, kind, loc), the others are shared. Each
    ``Deferred`` is read once (a scale copy is shared by the events of one update)."""
    values: dict[int, Any] = {}  # id(Deferred) -> value (``trace`` keeps every one alive)
    out = []
    for event in trace.events:
        data = event.data
        if not any(isinstance(value, Deferred) for value in data.values()):
            out.append(event)
            continue
        new = {}
        for key, value in data.items():
            if isinstance(value, Deferred):
                if id(value) not in values:
                    values[id(value)] = value.value()
                value = values[id(value)]
            new[key] = value
        out.append(Event(event.seq, event.kind, event.loc, new))
    return Trace(out)


class Recorder:
    def __init__(self, step_budget: int | None, finder: LocationFinder | None = None,
                 stop_conditions: list[StopCondition] | None = None,
                 hold_s: float | None = None):
        self.trace = Trace()
        self.finder = finder or LocationFinder()
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
        # when to end the replay early (instrument/stop.py); the first one that answers wins and
        # its exception is raised at the next safe point
        self.stop_conditions = (conditions(step_budget, hold_s) if stop_conditions is None
                                else stop_conditions)
        self._stop: tuple[type[StopReplay], str] | None = None
        # the status of the stop once raised into the script, and the threads it was raised in
        # (the main thread may end normally after workers were stopped: the replay was still cut)
        self.stop_raised: str | None = None
        self.script_thread = get_ident()  # the thread that runs the script (events: ``thread``)
        self._thread_numbers: dict[int, int] = {}
        self.stopped_threads: set[int] = set()
        # per moment, only the conditions that answer it (count_backward runs every backward)
        self._asked = {moment: [c for c in self.stop_conditions
                                if getattr(type(c), moment) is not getattr(StopCondition, moment)]
                       for moment in ("after_step", "after_backward")}
        # the tracked tensors: their numbers are the pids (hot loops inline ``tensors.get``)
        self.tensors = Identities()
        self.pid = self.tensors.get  # the tensor's pid, None if untracked (an attribute: hot path)
        # what p.grad was when we last saw it: pid -> (id(grad), grad._version)
        self.known_grad: dict[int, tuple[int, int]] = {}
        self.zeroed_grad: dict[int, tuple[int, int]] = {}  # left by zero_grad(set_to_none=False)
        # each owned parameter's ``_version`` right after the latest step that owns it: a
        # different one at the next step means it was changed in place by hand in between (EMA)
        self.param_version: dict[int, int] = {}
        # grads known to be finite: pid -> ((id(grad), grad._version), conditional). Vouched for
        # by a watched op that already looked at every value (clip_grad_norm_ with a finite total,
        # GradScaler.unscale_); valid while the grad is in exactly that state. ``conditional``:
        # only if the optimizer step then runs inside GradScaler.step, which runs it only when
        # unscale_ found no inf/NaN. Lets the step skip its own norm pass (see optim.py).
        self.finite: dict[int, tuple[tuple[int, int], bool]] = {}
        self.running_backwards: dict[int, Any] = {}  # thread ident -> its running backward's context
        # Which thread's backwards may read each tracked tensor's .grad: autograd writes a
        # leaf's .grad without the GIL, so reading another thread's tensor while its backward
        # runs races with that write (a crash, not a wrong number). pid -> thread ident of the
        # thread that tracked it or whose backward last reached it (``claim``).
        self.owner: dict[int, int] = {}
        self.owned_by: dict[int, int] = {}  # thread ident -> how many tensors it owns
        self.shared: set[int] = set()  # pids that more than one thread has owned
        # events and pids are numbered in order: threads of the script emit and track too
        self.lock = threading.RLock()
        self.optimizer_id = Identities()  # optimizer -> its number, given at first sight
        self.opt_params: dict[int, list[int]] = {}  # opt id -> pids it owns
        self.param_names: dict[int, str] = {}
        self.is_parameter: dict[int, bool] = {}
        self.shapes: dict[int, list[int]] = {}
        self.requires_grad: dict[int, bool] = {}
        self.internal_errors = 0
        # a watcher holding back events that may still grow; it has ``close()`` (emit them now,
        # in order, with ``trace.put``) and ``held()`` (copies for a snapshot: [(seq, kind, loc,
        # data)]) and ``hold_aside(made, loc)`` (keep an aside event after them; ``emit_aside``).
        # ``emit`` closes it before any other event, so the seqs are known ahead.
        self.holder: Any = None
        # folds repeated turns out of the trace in long runs (instrument/fold.py); None once
        # the run has ended (or if it failed)
        self.folder: Folder | None = Folder(self.trace)
        self._subscribers: dict[str, list[Callable]] = {topic: [] for topic in TOPICS}
        self._counted_step = self.subscribers("counted_step")
        self._budget_hold = self.subscribers("budget_hold")

    # -- watchers' topics ----------------------------------------------------------------
    def subscribe(self, topic: str, subscriber: Callable) -> None:
        """Have ``subscriber`` called on each ``topic`` (see ``TOPICS``), after the earlier ones."""
        self._subscribers[topic].append(subscriber)

    def subscribers(self, topic: str) -> list[Callable]:
        """The live list of a topic's subscribers, for its publisher to call."""
        return self._subscribers[topic]

    # -- events ------------------------------------------------------------------------
    def here(self, skip: int = 2) -> Location | None:
        try:
            return self.finder.here(skip)
        except Exception:  # never let the location lookup break the user's run
            return None

    def caller_of(self, skip: int = 2) -> Location | None:
        """``LocationFinder.caller_of``: the call site of the user's helper making this call."""
        try:
            return self.finder.caller_of(skip)
        except Exception:  # never let the location lookup break the user's run
            return None

    def emit(self, made: ev.Made, loc: Location | None = None) -> Event:
        """Append an event made by a constructor of ``graddoctor.events``; its data dict (and
        the lists in it) belongs to the event from now on."""
        with self.lock:
            return self._emit(made, loc)

    def _emit(self, made: ev.Made, loc: Location | None) -> Event:
        folder = self.folder
        # hot path: before it is active the folder only counts steps
        if folder is not None and (folder.active or made[0] == "step"):
            try:
                folder.observe(made[0], loc)  # before the held events: they come after it
            except Exception as exc:  # keep every event from now on
                self.folder = None
                self.internal_error("folding repeated turns", exc)
        if self.holder is not None:
            self.release()
        if made[0] in THREADED_KINDS and get_ident() != self.script_thread:
            made = (made[0], {**made[1], "thread": self._thread_number()})
        return self.trace.put(made, loc)

    def _thread_number(self) -> int:
        """1, 2, ...: the script's threads other than the one running it, in order of first use."""
        ident = get_ident()
        number = self._thread_numbers.get(ident)
        if number is None:
            number = self._thread_numbers[ident] = len(self._thread_numbers) + 1
        return number

    def emit_aside(self, made: ev.Made, loc: Location | None = None) -> None:
        """An observation made inside another watcher's open aggregate (a dropout call in a
        forward, a loss's shapes: ``events.ASIDE_KINDS``) that must not close it: the holder
        keeps it after its held events and their aggregates stay open; otherwise it is emitted
        as usual."""
        hold_aside = getattr(self.holder, "hold_aside", None)
        if hold_aside is not None:
            hold_aside(made, loc)
        else:
            self.emit(made, loc)

    def hold(self, holder) -> None:
        """Make ``holder`` the watcher holding events back; the previous one emits its now."""
        if self.holder is not holder:
            self.release()
            self.holder = holder

    def release(self) -> None:
        """Have the holder emit its held events now."""
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.close()

    def snapshot(self) -> Trace:
        """The trace so far as a new ``Trace`` that later events do not change: the emitted
        events (final, shared) and the held ones as they are now (new events with copies of
        their lists). ``Deferred`` values stay unread."""
        trace = self.trace
        events = list(trace.events)
        expected = trace.next_seq
        folder = self.folder
        try:
            marker = folder.marker() if folder is not None else None
        except Exception:  # changed under us (a watchdog's snapshot): its steps go uncounted
            marker = None
        if marker is not None and marker[0] <= len(events):  # the fold in progress, as it is now
            events.insert(*marker)
        holder = self.holder
        if holder is not None:
            for seq, kind, loc, data in holder.held():
                if seq == expected:  # else closed while we looked (another thread): in already
                    events.append(Event(seq, kind, loc, data))
                    expected += 1
        return Trace(events)

    def finish(self) -> None:
        """The end of the run: the held events are emitted, then ``trace`` becomes the final
        trace, where every ``Deferred`` value has been read (once per value, at the end of the
        run, when host syncs no longer cost the user anything). The recorded events stay as
        they were: those that held a value are replaced by new events in the new trace."""
        try:
            self.release()
        finally:
            folder, self.folder = self.folder, None
            try:
                if folder is not None:
                    folder.finish()  # the fold in progress ends with a ``folded`` event
            finally:
                self.trace = resolved(self.trace)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """graddoctor's own failure: recorded, never raised into the user's code."""
        self.internal_errors += 1
        if self.internal_errors <= 20:  # a hook failing on every call must not flood the trace
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.emit(ev.internal_error(where=where, error=detail))

    # -- tensors -------------------------------------------------------------------------
    def track(self, tensor) -> int:
        """Give a leaf tensor a pid (once), owned by the calling thread."""
        tensors = self.tensors
        pid = tensors.get(tensor)
        if pid is not None:
            return pid
        with self.lock:
            pid = tensors(tensor)
            if pid not in self.owner:
                self._own(pid, get_ident())
        self.is_parameter[pid] = isinstance(tensor, torch.nn.Parameter)
        self.shapes[pid] = _shape(tensor)
        self.requires_grad[pid] = tensor.requires_grad
        return pid

    def claim(self, pid: int) -> None:
        """The calling thread's backward reaches this tracked tensor: its backwards read the
        tensor's .grad from now on, other threads' no longer."""
        me = get_ident()
        if self.owner.get(pid) != me:
            with self.lock:
                self.shared.add(pid)
                self._own(pid, me)

    def _own(self, pid: int, thread: int) -> None:
        owned_by = self.owned_by
        old = self.owner.get(pid)
        if old is not None:
            left = owned_by[old] - 1
            if left:
                owned_by[old] = left
            else:
                del owned_by[old]
        self.owner[pid] = thread
        owned_by[thread] = owned_by.get(thread, 0) + 1

    def readable(self, others_running: bool) -> tuple:
        """``(pids, refs)``, two parallel sequences: the tracked tensors whose .grad the calling
        thread may read now and their weak references. Those it owns, less those another thread
        has owned while another thread's backward runs (a shared model trained from several
        threads). Every tracked tensor (``range``, the recorder's own list of references: read
        it, never change it) when the calling thread owns them all (one training thread)."""
        me = get_ident()
        refs = self.tensors.refs
        owned_by = self.owned_by
        if len(owned_by) == 1 and me in owned_by:
            if not (others_running and self.shared):
                return range(len(refs)), refs
        owner, shared = self.owner, self.shared
        pids = [pid for pid in range(len(refs))
                if owner.get(pid) == me and not (others_running and pid in shared)]
        return pids, [refs[pid] for pid in pids]

    def others_in_backward(self) -> bool:
        """Whether a thread other than the calling one runs a backward now."""
        running = self.running_backwards
        return bool(running) and (len(running) > 1 or get_ident() not in running)

    def name_params(self, names: dict[int, str]) -> None:
        """Name tracked tensors (pid -> ``model.fc1.weight``; ``instrument/names.py``)."""
        self.param_names.update(names)

    def refresh_params(self) -> None:
        """Read again what a parameter's ``param`` event reports and may have changed since it
        was tracked: ``requires_grad``, and the shape of a lazy parameter materialised since."""
        shapes, requires_grad = self.shapes, self.requires_grad
        for pid, ref in enumerate(self.tensors.refs):
            tensor = ref()
            if tensor is not None:
                requires_grad[pid] = tensor.requires_grad
                if shapes.get(pid) is None:
                    shapes[pid] = _shape(tensor)

    def add_params(self, opt: int, pids: list[int]) -> None:
        """Optimizer ``opt`` was given the tensors ``pids`` (``opt_params``)."""
        self.opt_params.setdefault(opt, []).extend(pids)

    def tensor(self, pid: int):
        return self.tensors.object(pid)

    def tracked_pids(self) -> list[int]:
        return list(range(len(self.tensors)))

    def grad_states(self, pids) -> list[tuple[int, tuple[int, int]]]:
        """``(pid, (id(grad), grad._version))`` for each pid whose tensor has a grad. The loops
        that run every step go through here: ``map``s that run in C, no Python per tensor."""
        pids = pids if type(pids) is list else list(pids)
        grads = grads_of(tensors_of(self.tensors.refs, pids))
        with_grad = list(map(is_not, grads, repeat(None)))
        if not all(with_grad):
            pids, grads = list(compress(pids, with_grad)), list(compress(grads, with_grad))
        return list(zip(pids, states_of(grads)))

    def after_step(self, pids) -> list[int]:
        """Per step, once per owned parameter: note requires_grad (the end-of-run ``param``
        events need it after the script's tensors are gone), refresh what its grad looks like
        after the step, note its ``_version`` (``param_version``), and return the pids that had
        no gradient. ``map``s that run in C, no Python per parameter."""
        pids = pids if type(pids) is list else list(pids)
        tensors = tensors_of(self.tensors.refs, pids)
        if not all(map(is_not, tensors, repeat(None))):  # some died: left as they were
            alive = list(map(is_not, tensors, repeat(None)))
            pids, tensors = list(compress(pids, alive)), list(compress(tensors, alive))
        self.requires_grad.update(zip(pids, map(_requires_grad, tensors)))
        self.param_version.update(zip(pids, map(_version, tensors)))
        grads = grads_of(tensors)
        with_grad = list(map(is_not, grads, repeat(None)))
        if all(with_grad):
            without = []
        else:
            without = list(compress(pids, map(is_, grads, repeat(None))))
            pids, grads = list(compress(pids, with_grad)), list(compress(grads, with_grad))
        self.known_grad.update(zip(pids, states_of(grads)))
        return without

    def note_known(self, states) -> None:
        """``(pid, state)`` pairs read after an in-place change graddoctor watched: the grads as
        they are now are still the accumulated ones, not a manual clear."""
        self.known_grad.update(states)

    def pids_of(self, tensors: list) -> list:
        """Each object's pid, None for an untracked one (``map``s in C when all are tracked)."""
        numbers = list(map(self.tensors.number.get, map(id, tensors)))
        if None not in numbers and all(map(is_, tensors_of(self.tensors.refs, numbers), tensors)):
            return numbers
        return list(map(self.pid, tensors))

    def cleared(self, params) -> list[int]:
        """A ``zero_grad`` has just cleared ``params``: their grads are fresh from now on, and
        one zero-filled in place (``set_to_none=False``) is remembered exactly as it was left.
        Returns the pids of the tracked ones."""
        params = params if type(params) is list else list(params)
        pids = self.pids_of(params)
        if None in pids:
            tracked = list(map(is_not, pids, repeat(None)))
            pids, params = list(compress(pids, tracked)), list(compress(params, tracked))
        known = self.known_grad
        if known:
            list(map(known.pop, pids, repeat(None)))
        grads = grads_of(params)
        with_grad = list(map(is_not, grads, repeat(None)))
        if any(with_grad):
            self.zeroed_grad.update(zip(compress(pids, with_grad),
                                        states_of(list(compress(grads, with_grad)))))
        return pids

    def backward_wrote(self, written, states: dict) -> None:
        """A backward has just written the grads of the pids in the lists ``written``;
        ``states`` (pid -> state) are those it left a grad in. Once per backward: the loops
        run here, over what the backward watcher's own pass collected."""
        zeroed, finite = self.zeroed_grad, self.finite
        # a new gradient: an old state could match it by a reused id (a voucher: a NaN missed)
        if zeroed or finite:
            for pids in written:
                for pid in pids:
                    zeroed.pop(pid, None)
                    finite.pop(pid, None)
        self.known_grad.update(states)

    def refresh_known(self, pids) -> list[tuple[int, tuple[int, int]]]:
        """After an in-place change we made or watched (clip, unscale, step): the grad as it is
        now is still the accumulated one, not a manual clear. Returns the states it read."""
        states = self.grad_states(pids)
        self.known_grad.update(states)
        return states

    def vouch_finite(self, states, conditional: bool = False) -> None:
        """A watched op has just seen every value of these grads finite (see ``finite``)."""
        self.finite.update(zip(map(_first, states), zip(map(_second, states), repeat(conditional))))

    def carry_finite(self, before: dict, after) -> None:
        """A watched op that keeps finite grads finite (clipping: a finite factor or a clamp)
        went from ``before`` (pid -> state) to ``after``: grads vouched for before still are."""
        finite = self.finite
        if not finite:
            return
        for pid, state in after:
            vouched = finite.get(pid)
            if vouched is not None:
                if vouched[0] == before.get(pid):
                    finite[pid] = (state, vouched[1])
                else:
                    del finite[pid]

    def backward_began(self, ctx) -> None:
        """The calling thread runs a backward (``ctx``: its context, None when graddoctor
        could not read it) until ``backward_ended``: backwards it calls meanwhile are nested."""
        self.running_backwards[get_ident()] = ctx

    def backward_ended(self) -> None:
        self.running_backwards.pop(get_ident(), None)

    def in_backward(self) -> bool:
        """Whether the calling code runs inside a backward: one this thread started, or any, from
        a thread Python did not start (autograd's device threads run reentrant checkpoints)."""
        running = self.running_backwards
        return bool(running) and (get_ident() in running
                                  or isinstance(threading.current_thread(), _DUMMY_THREAD))

    # -- stopping ------------------------------------------------------------------------
    def begins_update(self, opt: int | None) -> bool:
        """Whether a step of optimizer ``opt`` now would begin a new update."""
        return (self.backward_calls != self._update_mark or opt is None
                or opt in self._update_opts)

    def count_step(self, opt: int | None = None) -> None:
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
        for callback in self._counted_step:
            try:
                callback(self.updates)
            except Exception as exc:  # a display must never break the user's run
                self.internal_error("step callback", exc)
        self._ask("after_step")

    def count_backward(self) -> None:
        self.backward_calls += 1
        self._ask("after_backward")

    @property
    def stop_requested(self) -> bool:
        return self._stop is not None

    def _ask(self, moment: str) -> None:
        if self._stop is not None:
            return
        for condition in self._asked[moment]:
            try:
                reason = getattr(condition, moment)(self)
            except Exception as exc:
                self.internal_error("stop condition", exc)
                continue
            if reason:
                self._stop = (condition.exception, reason)
                return

    def holds(self):
        """Whether each ``budget_hold`` subscriber wants the replay to go on past the budget."""
        for hold in self._budget_hold:
            try:
                yield hold()
            except Exception as exc:
                self.internal_error("step budget", exc)
                yield False

    def divert_stop(self, handler: Callable[[type[StopReplay]], None] | None) -> None:
        """End the replay through ``handler(exception)`` at the safe point instead of raising
        the stop into the script (a spawned worker writes its report and exits there); with
        None, never end it (a forked copy of the process: nobody reads its trace)."""
        if handler is None:
            self._asked = {moment: [] for moment in self._asked}
            self._stop = None
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
