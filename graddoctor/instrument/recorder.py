"""The recorder: shared state of one instrumented run.

Every hook and wrapper writes through it. It owns the trace, numbers tensors (pids) and
knows which thread owns each, holds the watchers' topics (``instrument/topics.py``), and turns
its own failures into ``internal_error`` events instead of exceptions. Two jobs live in parts
of their own: what each tracked tensor's ``.grad`` was when graddoctor last saw it
(``grads``, ``instrument/gradstate.py``), and the counts of steps, backwards and updates with
the stop conditions asked after each (``progress``, ``instrument/progress.py``).

Events are final when emitted (``Event.data`` is read-only):

* A watcher whose events may still grow (the mode watcher's aggregates) holds them back as the
  recorder's ``holder``: ``emit`` has it emit them, finished and in order, before any other
  event, and ``finish`` at the end of the run. ``snapshot`` shows them as they are now.
* Device values recorded without a host sync stay ``Deferred`` in the trace; ``finish`` swaps
  the trace for its final form, a new ``Trace`` in which the events that held one are new
  ``Event`` objects holding the value. A snapshot taken before shows them unread.
"""

from __future__ import annotations

import threading
import traceback
from threading import get_ident
from typing import Any

import torch

from .. import events as ev
from ..events import THREADED_KINDS
from ..location import LocationFinder
from ..trace import Event, Location, Trace
from .fold import Folder
from .gradstate import GradState
from .identities import Identities
from .progress import Progress
from .stop import StopCondition
from .topics import TOPICS, F, Subscribers, Topic


_DUMMY_THREAD = getattr(threading, "_DummyThread", ())  # a thread Python did not start
_UNSET = object()
# ``Recorder.same_list``: the lengths it remembers lists of, and the lists it keeps per length;
# the hooks hand it only lists of at least SAME_LIST_MIN pids (a smaller model's lists are small:
# not worth the call on every full turn)
SAME_LIST_LENGTHS = 64
SAME_LISTS_PER_LENGTH = 4
SAME_LIST_MIN = 16


def _shape(tensor) -> list[int] | None:
    """The shape, or None for a lazy module's UninitializedParameter (no shape until its first
    forward; the end-of-run ``param`` event reads it again)."""
    try:
        return list(tensor.shape)
    except RuntimeError:
        return None


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
        self.script_thread = get_ident()  # the thread that runs the script (events: ``thread``)
        self._thread_numbers: dict[int, int] = {}
        # the tracked tensors: their numbers are the pids (hot loops inline ``tensors.get``)
        self.tensors = Identities()
        self.pid = self.tensors.get  # the tensor's pid, None if untracked (an attribute: hot path)
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
        # length -> the latest lists of pids of that length put into events (``same_list``)
        self._same_lists: dict[int, list[list]] = {}
        self.opt_params: dict[int, list[int]] = {}  # opt id -> pids it owns (add_params: never changed in place)
        self.param_names: dict[int, str] = {}
        self.is_parameter: dict[int, bool] = {}
        self.shapes: dict[int, list[int]] = {}
        self.requires_grad: dict[int, bool] = {}
        self.internal_errors = 0
        self._here_memo: list | None = None  # [thread, its location or _UNSET] (``describing``)
        # a watcher holding back events that may still grow; it has ``close()`` (emit them now,
        # in order, with ``trace.put``) and ``held()`` (copies for a snapshot: [(seq, kind, loc,
        # data)]) and ``hold_aside(made, loc)`` (keep an aside event after them; ``emit_aside``).
        # ``emit`` closes it before any other event, so the seqs are known ahead.
        self.holder: Any = None
        # folds repeated turns out of the trace in long runs (instrument/fold.py); None once
        # the run has ended (or if it failed)
        self.folder: Folder | None = Folder(self.trace)
        self.folder.owned = self._owned_count  # its starts scale with the model (fold.scaled_start)
        self._subscribers: dict[Topic, Subscribers] = {topic: Subscribers() for topic in TOPICS}
        # what each tracked tensor's .grad was when last seen (instrument/gradstate.py)
        self.grads = GradState(self.tensors, self.requires_grad)
        # steps, backwards and updates counted; when to end the replay (instrument/progress.py)
        self.progress = Progress(self, step_budget, stop_conditions, hold_s)

    def _owned_count(self) -> int:
        """How many tensors the optimizers own (one owned by two counted twice)."""
        return sum(map(len, self.opt_params.values()))

    # -- watchers' topics (instrument/topics.py) -----------------------------------------
    def subscribe(self, topic: Topic[F], subscriber: F) -> None:
        """Have ``subscriber`` called on each ``topic``, after the earlier ones (a topic not in
        ``TOPICS``, a string included, is a KeyError)."""
        self._subscribers[topic].add(subscriber)

    def retire(self, topic: Topic[F], subscriber: F) -> None:
        """``subscriber`` is no longer called on ``topic`` (a watcher with nothing left to do:
        it costs no call per step from now on), until it is resumed. Safe while the topic is
        being published, from any thread."""
        with self.lock:
            self._subscribers[topic].set_active(subscriber, False)

    def resume(self, topic: Topic[F], subscriber: F) -> None:
        """A retired ``subscriber`` is called on ``topic`` again, at its place in the order
        (nothing if it was not retired)."""
        with self.lock:
            self._subscribers[topic].set_active(subscriber, True)

    def subscribers(self, topic: Topic[F]) -> Subscribers[F]:
        """A topic's subscribers, for its publisher to call: it loops over their ``now``."""
        return self._subscribers[topic]

    # -- events ------------------------------------------------------------------------
    def here(self, skip: int = 2) -> Location | None:
        memo = self._here_memo
        if memo is not None and skip == 2 and memo[0] == get_ident():
            # inside one describe_loss publish every describer's caller is the same user line
            # (graddoctor's frames lie between): looked up once (``describing``)
            if memo[1] is _UNSET:
                try:
                    memo[1] = self.finder.here(skip)
                except Exception:  # never let the location lookup break the user's run
                    memo[1] = None
            return memo[1]
        try:
            return self.finder.here(skip)
        except Exception:  # never let the location lookup break the user's run
            return None

    def describing(self, on: bool) -> None:
        """A backward's loss describers run (``DESCRIBE_LOSS``, on this thread) between
        ``describing(True)`` and ``describing(False)``: ``here()`` from any of them finds the same
        user frame (the ``backward()`` call, or the script's own wrapper of it), so it is looked
        up once for all of them."""
        self._here_memo = [get_ident(), _UNSET] if on else None

    def caller_of(self, skip: int = 2) -> Location | None:
        """``LocationFinder.caller_of``: the call site of the user's helper making this call."""
        try:
            return self.finder.caller_of(skip)
        except Exception:  # never let the location lookup break the user's run
            return None

    def emit(self, made: ev.Made, loc: Location | None = None) -> Event:
        """Append an event made by a constructor of ``graddoctor.events``; its data dict (and
        the lists in it) belongs to the event from now on."""
        with self.lock:  # hot path: every event of a run
            folder = self.folder
            kind = made[0]
            # the steady state of a long run: a turn that repeats the one before goes aside
            # (instrument/fold.py, ``Folder.steady_put``) until one does not
            if folder is not None and folder.steady is not None:
                try:
                    if get_ident() != self.script_thread:
                        folder.materialize()
                    elif self.holder is None:
                        event = folder.steady_put(made, loc)
                        if event is not None:
                            return event
                    elif folder.steady_accepts([*self.holder.heads(), (kind, loc)]):
                        # the held events (a forward's mode_forward) and this one repeat the
                        # turn: all go onto the steady path, in the order recording puts them
                        self.release()
                        event = folder.steady_put(made, loc)
                        if event is not None:
                            return event
                    else:
                        folder.materialize()
                except Exception as exc:  # keep every event from now on
                    self.folder = folder = None
                    self.internal_error("folding repeated turns", exc)
            # before it is active the folder only counts steps
            if folder is not None and (folder.active or kind == "step"):
                try:
                    folder.observe(kind, loc)  # before the held events: they come after it
                except Exception as exc:  # keep every event from now on
                    self.folder = None
                    self.internal_error("folding repeated turns", exc)
            if self.holder is not None:
                self.release()
            if kind in THREADED_KINDS and get_ident() != self.script_thread:
                made = (kind, {**made[1], "thread": self._thread_number()})
            return self.trace.put(made, loc)

    def same_list(self, pids: list) -> list:
        """An equal list of pids that an event already holds, else a copy of ``pids`` sized to
        its length (``list(compress(...))`` leaves room to grow): one object for equal values.
        A loop whose turns never fold (a mixture of experts' routing) keeps every turn's lists
        in the trace; equal ones (the gradients a clip clips, those the backward before it
        wrote; a routing seen a few turns before) are then held once. Only for a list handed to
        an event (final: never changed afterwards), given up for the one returned. Compared, in
        C and newest first, with the last ``SAME_LISTS_PER_LENGTH`` lists of each of the last
        ``SAME_LIST_LENGTHS`` lengths met."""
        lists = self._same_lists
        n = len(pids)
        recent = lists.pop(n, None)  # (put back last: the length met latest)
        if recent is None:
            if len(lists) >= SAME_LIST_LENGTHS:  # the length met longest ago
                lists.pop(next(iter(lists)), None)
            recent = []
        elif pids in recent:
            lists[n] = recent
            return recent[recent.index(pids)]
        pids = pids[:]
        lists[n] = [pids, *recent[:SAME_LISTS_PER_LENGTH - 1]]
        return pids

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
        """Make ``holder`` the watcher holding events back; the previous one emits its now. In
        the steady state of a long run the script's thread keeps it: ``emit`` puts the held
        events onto the steady path with the event that releases them, or ends it first."""
        if self.holder is not holder:
            self.release()
            if get_ident() != self.script_thread:
                self._leave_steady()  # held events go into the trace, not past the steady path
            self.holder = holder

    def release(self) -> None:
        """Have the holder emit its held events now (``put_held``)."""
        holder, self.holder = self.holder, None
        if holder is not None:
            if get_ident() != self.script_thread:
                self._leave_steady()
            holder.close()

    def release_onto_steady(self, kind: str, loc: Location | None) -> bool:
        """A straight-line hook about to take the steady path's next event (``kind``, ``loc``)
        while a holder holds: its events go onto the steady path first when they and that
        event repeat the turn (``Folder.steady_accepts``). False: nothing done (the full path
        records them as usual)."""
        folder, holder = self.folder, self.holder
        if holder is None:
            return True
        if folder is None or folder.steady is None or get_ident() != self.script_thread:
            return False
        with self.lock:
            try:
                if not folder.steady_accepts([*holder.heads(), (kind, loc)]):
                    return False
            except Exception as exc:  # keep every event from now on
                self.folder = None
                self.internal_error("folding repeated turns", exc)
                return False
            self.release()
            return self.holder is None

    def put_held(self, made: ev.Made, loc: Location | None = None) -> Event:
        """A holder's event into the trace (its ``close``), with the seq it was promised: onto
        the steady path while the steady state lasts (``Folder.steady_put``), else appended."""
        with self.lock:
            folder = self.folder
            if folder is not None and folder.steady is not None:
                try:
                    event = folder.steady_put(made, loc)
                    if event is not None:
                        return event
                except Exception as exc:  # keep every event from now on
                    self.folder = None
                    self.internal_error("folding repeated turns", exc)
            return self.trace.put(made, loc)

    def end_steady(self) -> None:
        """End the folder's steady state now (a watcher that found a deviation after the call
        it watched had already run): the trace as if every turn had been recorded."""
        self._leave_steady()

    def _leave_steady(self, for_snapshot: bool = False) -> None:
        """End the folder's steady state: the trace as if every turn had been recorded (for a
        snapshot: nothing deviated, so the next repeating turn takes it up again)."""
        folder = self.folder
        if folder is not None and folder.steady is not None:
            with self.lock:
                try:
                    folder.materialize(resume=for_snapshot)
                except Exception as exc:  # keep every event from now on
                    self.folder = None
                    self.internal_error("folding repeated turns", exc)

    def snapshot(self) -> Trace:
        """The trace so far as a new ``Trace`` that later events do not change: the emitted
        events (final, shared) and the held ones as they are now (new events with copies of
        their lists). ``Deferred`` values stay unread."""
        folder = self.folder
        if folder is not None and folder.steady is not None:
            # the turns on the steady path into the trace (under the lock: the script's thread
            # may be emitting; a watchdog's snapshot of a hung script finds it free)
            if self.lock.acquire(timeout=1.0):
                try:
                    self._leave_steady(for_snapshot=True)
                finally:
                    self.lock.release()
            folder = self.folder
        trace = self.trace
        events = list(trace.events)
        expected = trace.next_seq
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
            self.grads.catch_up()  # after a skim: the parameters' requires_grad as they are
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
        self.grads.requires_noted = None  # (GradState.note_requires_grad: another writer)
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

    def stepped_requires_grad(self) -> dict[int, bool]:
        """pid -> ``requires_grad`` as the last step of an optimizer that owns it read it (each
        step notes it: ``GradState``), for the parameters of optimizers that stepped."""
        noted = self.grads.requires_grad  # caught up after skimmed steps
        steps = self.progress.opt_steps
        return {pid: noted[pid] for opt, pids in self.opt_params.items() if steps.get(opt)
                for pid in pids if pid in noted}

    def refresh_params(self) -> None:
        """Read again what a parameter's ``param`` event reports and may have changed since it
        was tracked: ``requires_grad``, and the shape of a lazy parameter materialised since."""
        shapes, requires_grad = self.shapes, self.requires_grad
        self.grads.requires_noted = None  # (GradState.note_requires_grad: another writer)
        for pid, ref in enumerate(self.tensors.refs):
            tensor = ref()
            if tensor is not None:
                requires_grad[pid] = tensor.requires_grad
                if shapes.get(pid) is None:
                    shapes[pid] = _shape(tensor)

    def add_params(self, opt: int, pids: list[int]) -> None:
        """Optimizer ``opt`` was given the tensors ``pids`` (``opt_params``). Its list is
        replaced, never changed in place: the ``clear`` event of every zero_grad holds it as
        it is (a copy per step is a pass over every pid, the cost of a long run's clears)."""
        self.opt_params[opt] = [*self.opt_params.get(opt, ()), *pids]

    def tensor(self, pid: int):
        return self.tensors.object(pid)

    def tracked_pids(self) -> list[int]:
        return list(range(len(self.tensors)))

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
