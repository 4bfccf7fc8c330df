"""The window a loss-graph watcher reads: the first few backwards of a run, and again the first
few of each later training phase.

A watcher that judges the loss's autograd graph (an axis, a weight, a pooling) reads it at the
first ``size`` backwards and then costs nothing. A script that trains in phases (a fine-tuning
stage after pre-training, a student after its teacher) builds another loss there, which those
backwards never showed. The sign of a new phase read here is an optimizer given parameters after
the window closed (``PARAMS_ADDED``: the later phase's own optimizer, or a group added to one):
the window opens again for ``size`` backwards, at most ``REOPENS`` times a run, so that a loop
that builds an optimizer every step pays a bounded cost.
"""

from __future__ import annotations

from typing import Any, Callable

from .recorder import Recorder
from .topics import DESCRIBE_LOSS

REOPENS = 2  # later phases whose losses are read, per run


class LossWindow:
    """A watcher holds it as ``loss_window``: the instrumentation subscribes ``params_added``
    to ``PARAMS_ADDED`` for every watcher that has one."""

    __slots__ = ("rec", "size", "taken", "reopened", "describer", "retired", "on_reopen")

    def __init__(self, rec: Recorder, size: int, describer: Callable[[Any], dict] | None = None,
                 on_reopen: Callable[[], None] | None = None):
        """``describer``: the watcher's ``DESCRIBE_LOSS`` subscriber, retired from the topic once
        the window closes (no call per backward from then on) and resumed when it reopens; None
        for a watcher that stays subscribed. ``on_reopen``: what the watcher puts back when the
        window reopens (the module hooks it removed at the close)."""
        self.rec, self.size, self.describer, self.on_reopen = rec, size, describer, on_reopen
        self.taken = 0
        self.reopened = 0
        self.retired = False

    def take(self) -> bool:
        """Whether this backward is in the window (counting it); the window's last backward
        retires the describer (safe while the topic is published: this call still runs)."""
        if self.taken >= self.size:
            return False
        self.taken += 1
        if self.taken >= self.size and self.describer is not None:
            self.retired = True
            self.rec.retire(DESCRIBE_LOSS, self.describer)
        return True

    @property
    def closed(self) -> bool:
        return self.taken >= self.size

    def end(self) -> None:
        """The watcher read enough before ``size`` backwards (its own, finer count ran out):
        the window is closed, and a later phase opens it again."""
        self.taken = max(self.taken, self.size)
        if self.describer is not None and not self.retired:
            self.retired = True
            self.rec.retire(DESCRIBE_LOSS, self.describer)

    def params_added(self, opt: int, pids: list) -> None:
        """PARAMS_ADDED: an optimizer given parameters after the window closed begins a later
        phase: read its first ``size`` backwards too."""
        if self.taken < self.size or self.reopened >= REOPENS:
            return
        self.reopened += 1
        self.taken = 0
        if self.retired:
            self.retired = False
            self.rec.resume(DESCRIBE_LOSS, self.describer)
        if self.on_reopen is not None:
            self.on_reopen()
