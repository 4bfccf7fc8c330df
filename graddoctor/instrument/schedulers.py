"""Learning-rate schedulers: every user call of ``scheduler.step()``.

``LRScheduler.step`` is patched on the base class and on each loaded subclass that overrides it
(``ReduceLROnPlateau``, ``SequentialLR``, ``ChainedScheduler``, ``CosineAnnealingWarmRestarts``,
...). Calls made by PyTorch itself are not the user's: the initial step inside the constructor
(``_initial_step``) and the steps a ``SequentialLR`` / ``ChainedScheduler`` makes on the
schedulers it holds. PyTorch also wraps ``optimizer.step`` on the instance for its own "scheduler
before optimizer" warning; that wrapper still runs the class's step, so the global optimizer
step hooks keep firing.
"""

from __future__ import annotations

import functools

from torch.optim.lr_scheduler import LRScheduler

from .. import events as ev
from .identities import Identities
from .recorder import Recorder
from .subclasses import Depth, patch_tree


class SchedulerWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.scheduler_id = Identities()  # scheduler -> its number
        self._in_step = Depth()
        self._in_init = Depth()

    def _wrap_step(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def step(scheduler, *args, **kwargs):
            if watcher._in_step.active or watcher._in_init.active:
                return original(scheduler, *args, **kwargs)
            try:
                optimizer = getattr(scheduler, "optimizer", None)
                rec.emit(ev.scheduler_step(
                    sched=watcher.scheduler_id(scheduler), cls=type(scheduler).__name__,
                    opt=rec.optimizer_id(optimizer) if optimizer is not None else None), rec.here(2))
            except Exception as exc:
                rec.internal_error("lr_scheduler.step", exc)
            with watcher._in_step:
                return original(scheduler, *args, **kwargs)

        return step

    def _wrap_initial_step(self, original):
        watcher = self

        @functools.wraps(original)
        def _initial_step(scheduler, *args, **kwargs):
            with watcher._in_init:
                return original(scheduler, *args, **kwargs)

        return _initial_step

    def install(self, patcher) -> None:
        patch_tree(patcher, LRScheduler, "step", self._wrap_step)
        patch_tree(patcher, LRScheduler, "_initial_step", self._wrap_initial_step)
