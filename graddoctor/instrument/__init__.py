"""Install every hook and wrapper in one place; remove them all on exit.

``Instrumentation`` is a context manager around the user's run. Each watcher owns one area
(backward, optimizers, data loading, ...) and installs itself through a shared ``Patcher`` so
that leaving the context restores torch exactly as it was, also after a crash.
"""

from __future__ import annotations

from .amp import GradScalerWatcher
from .backward import BackwardWatcher
from .clip import ClipWatcher
from .compile import CompileWatcher
from .dataloader import DEFAULT_EPOCH_BATCHES, DataLoaderWatcher
from .ddp import DDPWatcher
from .dropout import FunctionalDropoutWatcher
from .idle import IdleParamWatcher
from .losses import LossShapeWatcher
from .modes import ModeWatcher
from .names import emit_param_events, name_parameters
from .optim import OptimizerWatcher
from .patcher import Patcher
from .recorder import Recorder
from .stop import ReplayTimeout, StepLimitReached, StopReplay
from .schedulers import SchedulerWatcher

__all__ = ["Instrumentation", "Recorder", "StopReplay", "StepLimitReached", "ReplayTimeout"]


class Instrumentation:
    def __init__(self, rec: Recorder, epoch_batches: int = DEFAULT_EPOCH_BATCHES):
        self.rec = rec
        self.patcher = Patcher()
        self.optimizers = OptimizerWatcher(rec)
        self.backward = BackwardWatcher(rec, self.optimizers.owned)
        self.dataloader = DataLoaderWatcher(rec, epoch_batches)
        self.watchers = [self.optimizers, self.backward, self.dataloader]
        # AMP, clipping, schedulers (issue 3)
        self.backward.loss_describers.append(self.dataloader.describe_loss)
        self.watchers += [GradScalerWatcher(rec, self.backward), ClipWatcher(rec),
                          SchedulerWatcher(rec)]  # grad edits: OptimizerWatcher's step pass
        # BatchNorm/dropout modes (issue 4)
        self.modes = ModeWatcher(rec, self.optimizers.owned)
        self.watchers.append(self.modes)
        self.optimizers.freeze_seq = self.modes.freeze_seq  # a frozen param's step names its freeze
        # functional dropout left on in eval mode; regression losses that broadcast (wave 2)
        self.watchers += [FunctionalDropoutWatcher(rec), LossShapeWatcher(rec)]
        # where the parameters that never get a gradient are used (param-without-grad)
        self.idle = IdleParamWatcher(rec)
        self.optimizers.without_listener = self.idle.after_step
        self.watchers.append(self.idle)
        # DistributedDataParallel all-reduces and no_sync, DistributedSampler epochs (issue 16)
        self.ddp = DDPWatcher(rec)
        self.backward.loss_describers.append(self.ddp.describe_loss)
        self.optimizers.step_listeners.append(self.ddp.after_step)
        self.backward.aside = self.ddp  # FSDP2's accumulation without gradient sync
        self.watchers.append(self.ddp)
        # torch.compile: keep all of the above out of compiled graphs (issue 6)
        self.compile = CompileWatcher(rec)
        self.watchers.append(self.compile)
        self._named_once = False
        self.script_globals: dict | None = None  # set by the caller once the script has run
        self.optimizers.step_listeners.append(self._name_after_first_step)

    def _name_after_first_step(self, opt, optimizer) -> None:
        # modules are alive now (they may be gone when a main() function has returned)
        if not self._named_once:
            self._named_once = True
            name_parameters(self.rec)

    def __enter__(self) -> "Instrumentation":
        try:
            for watcher in self.watchers:
                watcher.install(self.patcher)
        except BaseException:
            self.patcher.undo()
            raise
        return self

    def __exit__(self, *exc) -> None:
        rec = self.rec
        try:
            rec.finish()  # held events out, Deferred values read: rec.trace is the final trace
        except Exception as error:
            rec.internal_error("reading deferred device values", error)
        try:
            name_parameters(rec, self.script_globals or {})
            emit_param_events(rec)
        except Exception as error:
            rec.internal_error("naming parameters", error)
        for error in self.patcher.undo():
            rec.internal_error("removing instrumentation", error)
