"""What watchers tell each other, in one place: one typed ``Topic`` per message.

A topic has one publisher and any number of subscribers (``Recorder.subscribe``); its type
parameter is the subscribers' signature, so a type checker holds both sides to it. The
publisher loops over ``now`` of the ``Subscribers`` that ``Recorder.subscribers`` gave it at
construction: no lookup per event. A subscriber with nothing left to do leaves
(``Recorder.retire``) and may come back (``Recorder.resume``) at its place in the order. ``TOPICS`` lists them all; the recorder refuses any other (``tests/test_instrument_topics.py``
holds that each has exactly one publisher).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import eq, itemgetter
from typing import Any, Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_first, _second = itemgetter(0), itemgetter(1)


class Subscribers(Generic[F]):
    """A topic's subscribers in the order they subscribed, and ``now``: the tuple of those not
    retired, which the publisher loops over. ``now`` is replaced, never changed, so that a
    subscriber that retires or resumes one (itself included) while the topic is published
    changes nothing in the loop that is running: each call of that publication still happens."""

    __slots__ = ("now", "_entries", "_on_change")

    def __init__(self) -> None:
        self.now: tuple[F, ...] = ()
        self._entries: list[list] = []  # [subscriber, active] in the order subscribed
        self._on_change: list[Callable[[], None]] = []  # told after ``now`` is replaced

    def on_change(self, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called each time ``now`` is replaced: for a publisher that
        skips the loop while ``now`` is empty (``Progress``: a test per step instead of a loop)."""
        self._on_change.append(callback)

    def add(self, subscriber: F) -> None:
        self._entries.append([subscriber, True])
        self._rebuild()

    def set_active(self, subscriber: F, active: bool) -> None:
        """Retire (False) or resume (True) each entry equal to ``subscriber`` (a bound method
        is equal to another of the same object and function). The entries are compared in C:
        a window's end retires a watcher from topics of some seventy subscribers."""
        entries = self._entries
        changed = False
        for entry in compress(entries, map(eq, repeat(subscriber), map(_first, entries))):
            if entry[1] is not active:
                entry[1] = active
                changed = True
        if changed:
            self._rebuild()

    def _rebuild(self) -> None:
        entries = self._entries
        self.now = tuple(compress(map(_first, entries), map(_second, entries)))
        for callback in self._on_change:
            callback()

    def __iter__(self):
        return iter(self.now)

    def __len__(self) -> int:
        return len(self.now)


class Topic(Generic[F]):
    """A message between watchers: ``name``, who publishes it and what its subscribers (of
    type ``F``) are called with. Compared by identity: a string is never a topic."""

    __slots__ = ("name", "publisher", "carries")

    def __init__(self, name: str, publisher: str, carries: str) -> None:
        self.name, self.publisher, self.carries = name, publisher, carries

    def __repr__(self) -> str:
        return f"<topic {self.name}>"


PARAMS_ADDED: Topic[Callable[[int, list[int]], None]] = Topic(
    "params_added", "OptimizerWatcher", "(opt, pids) after an optimizer was given a param group")
STEPPED: Topic[Callable[[int, Any], None]] = Topic(
    "stepped", "OptimizerWatcher", "(opt, optimizer) after each real optimizer step")
STEP_GRADS: Topic[Callable[[int, Any, dict, "list[int] | None", "list[float] | None"], None]] = Topic(
    "step_grads", "OptimizerWatcher",
    "(opt, optimizer, by_device, norm_pids, norms) before each optimizer step that is not a "
    "closure step: its dense gradients by device {device: ([pid], [grad])} and their norms "
    "when it measured them (else None)")
STEP_BEGINS: Topic[Callable[[int, Any], None]] = Topic(
    "step_begins", "OptimizerWatcher",
    "(opt, optimizer) before each outermost optimizer step that is not a closure step, before "
    "its parameters change")
STEP_NORMS: Topic[Callable[["list[int]", "list[float]"], None]] = Topic(
    "step_norms", "OptimizerWatcher",
    "(norm_pids, norms) before each optimizer step whose gradient norms it measured (host floats)")
STEPPED_WITHOUT_GRAD: Topic[Callable[[int, list[int]], None]] = Topic(
    "stepped_without_grad", "OptimizerWatcher",
    "(opt, pids) after each real optimizer step that left some of its parameters without a "
    "gradient, those parameters (the other steps are not published: Progress.stepped counts them)")
DESCRIBE_LOSS: Topic[Callable[[Any], dict]] = Topic(
    "describe_loss", "BackwardWatcher",
    "(tensors) -> dict of keyword arguments of events.backward for the backward about to run "
    "from them")
LEAF_TRACKED: Topic[Callable[[], None]] = Topic(
    "leaf_tracked", "BackwardWatcher",
    "() after a leaf that is no parameter was first tracked (one that lives across backwards: "
    "a learnable tensor made with requires_grad=True)")
FREEZE_OF: Topic[Callable[[Any], "int | None"]] = Topic(
    "freeze_of", "OptimizerWatcher", "(param) -> seq of the event that froze it, or None")
COUNTED_STEP: Topic[Callable[[int], None]] = Topic(
    "counted_step", "Progress.count_step",
    "(updates) after each optimizer step is counted, before its listeners (the progress line: "
    "updates, what the budget counts)")
BUDGET_HOLD: Topic[Callable[[], bool]] = Topic(
    "budget_hold", "Progress.holds",
    "() -> True while the replay should go on past the step budget (e.g. until a DataLoader "
    "has crossed two epoch boundaries); each must bound itself")
STATE_LOADED: Topic[Callable[[Any, Any], None]] = Topic(
    "state_loaded", "ParamResetWatcher",
    "(module, state_dict) before the user's outermost Module.load_state_dict runs (the method "
    "has one wrapper, the reset watcher's)")
STATE_TAKEN: Topic[Callable[[Any], None]] = Topic(
    "state_taken", "SnapshotWatcher",
    "(module) after each of the user's outermost Module.state_dict() calls (not keep_vars)")

BATCH_SERVED: Topic[Callable[[int, int, int, Any], None]] = Topic(
    "batch_served", "DataLoaderWatcher",
    "(loader, epoch, index, batch) for each of the first batches the DataLoaders serve "
    "(SERVED_BATCHES in all), as the loader yields it")

EPOCH_BEGUN: Topic[Callable[[int, int], None]] = Topic(
    "epoch_begun", "DataLoaderWatcher",
    "(loader, epoch) when a DataLoader's iteration begins an epoch after its first (where a "
    "script unfreezes layers or switches phases)")

GRADS_UNSCALED: Topic[Callable[["list[int]"], None]] = Topic(
    "grads_unscaled", "GradScalerWatcher",
    "(pids) after GradScaler.unscale_ divided those grads in place, which moves no version counter")

TOPICS: tuple[Topic, ...] = (PARAMS_ADDED, STEPPED, STEP_GRADS, STEP_BEGINS, STEP_NORMS, STEPPED_WITHOUT_GRAD,
                             DESCRIBE_LOSS, LEAF_TRACKED, FREEZE_OF, COUNTED_STEP, BUDGET_HOLD,
                             STATE_LOADED, STATE_TAKEN, BATCH_SERVED, EPOCH_BEGUN, GRADS_UNSCALED)
