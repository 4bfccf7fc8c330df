"""Watchers that measure each optimizer's first updates on one step topic, then leave it.

A subclass names its ``topic`` (``STEP_BEGINS`` or ``STEPPED``) and its ``label`` (for
``internal_error``), keeps ``_left`` (optimizer -> updates still to measure; 0 when done or
never measured) through its ``_start(opt, optimizer)`` and ``_measure(opt, optimizer)``, and
calls ``_on_step`` from the method it subscribed. Once every optimizer the recorder has
registered is done the watcher leaves the topic, so later steps pay nothing for it; it comes
back on ``PARAMS_ADDED`` for an optimizer not measured yet (one made later, or adopted by
``watch()``, registers before it steps).
"""

from __future__ import annotations

from .recorder import Recorder
from .topics import PARAMS_ADDED


class PerOptimizerWindow:
    topic: str
    label: str

    def __init__(self, rec: Recorder, on_step):
        self.rec = rec
        self._left: dict[int, int] = {}
        self._groups: dict[int, list] = {}  # opt -> what is measured of its param groups
        self._on_step_method = on_step  # the subscribed method (bound), to resume and retire
        rec.subscribe(self.topic, on_step)
        rec.subscribe(PARAMS_ADDED, self.params_added)

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def params_added(self, opt: int, pids) -> None:
        """``PARAMS_ADDED``: an optimizer not measured yet: back on the step topic."""
        if self._left.get(opt, 1):
            self.rec.resume(self.topic, self._on_step_method)

    def _on_step(self, opt: int, optimizer) -> None:
        left = self._left
        if not left.get(opt, 1):
            return
        try:
            if opt not in left:
                self._start(opt, optimizer)
            if left[opt]:
                self._measure(opt, optimizer)
        except Exception as exc:
            left[opt] = 0
            self._groups.pop(opt, None)
            self.rec.internal_error(self.label, exc)
        if not left[opt] and all(not left.get(other, 1) for other in self.rec.opt_params):
            self.rec.retire(self.topic, self._on_step_method)  # every optimizer measured

    def _start(self, opt: int, optimizer) -> None:
        raise NotImplementedError

    def _measure(self, opt: int, optimizer) -> None:
        raise NotImplementedError
