"""Install every hook and wrapper in one place; remove them all on exit.

``Instrumentation`` is a context manager around the user's run. Each watcher owns one area
(backward, optimizers, data loading, ...) and installs itself through a shared ``Patcher`` so
that leaving the context restores torch exactly as it was, also after a crash.
"""

from __future__ import annotations

import threading

from .amp import GradScalerWatcher
from .backward import BackwardWatcher
from .clip import ClipWatcher
from .compile import CompileWatcher
from .customfn import CustomFunctionWatcher
from .dataloader import DEFAULT_EPOCH_BATCHES, DataLoaderWatcher
from .ddp import DDPWatcher
from .dropout import FunctionalDropoutWatcher
from .functional import FunctionalGradWatcher
from .gradflow import GradFlowWatcher
from .idle import IdleParamWatcher
from .liveness import GraphLivenessWatcher
from .loss_inputs import LossInputWatcher
from .losses import LossShapeWatcher
from .modes import ModeWatcher
from .names import LiveModules, emit_param_events, name_parameters, user_variables
from .optim import OptimizerWatcher
from .patcher import Patcher
from .precision import PrecisionWatcher
from .recorder import Recorder
from .rng import RngSeedWatcher
from .registration import ModuleAttrWatcher, ParamLifeWatcher, find_unregistered
from .stop import ReplayTimeout, StepLimitReached, StopReplay
from .schedulers import SchedulerWatcher
from .warnsource import WarningSource

__all__ = ["Instrumentation", "Recorder", "StopReplay", "StepLimitReached", "ReplayTimeout"]


class Instrumentation:
    def __init__(self, rec: Recorder, epoch_batches: int = DEFAULT_EPOCH_BATCHES,
                 grad_flow: bool = False):
        self.rec = rec
        self.patcher = Patcher()
        # made before the watchers that read their state; installed in the order of ``watchers``
        self.scalers = GradScalerWatcher(rec)
        self.ddp = DDPWatcher(rec)
        self.optimizers = OptimizerWatcher(rec, self.scalers)
        self.backward = BackwardWatcher(rec, self.optimizers, aside=self.ddp)  # FSDP2's aside
        self.dataloader = DataLoaderWatcher(rec, epoch_batches)
        self.watchers = [WarningSource(), self.optimizers, self.backward, self.dataloader]
        # AMP, clipping, schedulers
        rec.subscribe("describe_loss", self.dataloader.describe_loss)
        rec.subscribe("describe_loss", self.scalers.describe_loss)
        self.watchers += [self.scalers, ClipWatcher(rec),
                          SchedulerWatcher(rec)]  # grad edits: OptimizerWatcher's step pass
        # BatchNorm/dropout modes
        self.modes = ModeWatcher(rec, self.optimizers.owned_pids())
        self.watchers.append(self.modes)
        rec.subscribe("freeze_of", self.modes.freeze_seq)  # a frozen param's step names its freeze
        # functional dropout left on in eval mode; regression losses that broadcast;
        # classification losses given probabilities where logits or log-probabilities belong
        self.watchers += [FunctionalDropoutWatcher(rec), LossShapeWatcher(rec), LossInputWatcher(rec)]
        # gradients taken with torch.autograd.grad / torch.func, which graddoctor does not follow
        self.watchers.append(FunctionalGradWatcher(rec))
        # the global RNG seeded (reseed-in-loop)
        self.watchers.append(RngSeedWatcher(rec))
        # custom autograd.Functions: each class's backward checked once against its forward
        self.watchers.append(CustomFunctionWatcher(rec))
        # half-precision parameters: an eps that rounds to 0, updates below the dtype's resolution
        self.watchers.append(PrecisionWatcher(rec))
        # graphs of earlier backwards the script keeps referenced (a running total of losses)
        rec.subscribe("describe_loss", GraphLivenessWatcher(rec).describe_loss)
        # where the parameters that never get a gradient are used (param-without-grad)
        self.idle = IdleParamWatcher(rec)
        rec.subscribe("stepped_without_grad", self.idle.after_step)
        self.watchers.append(self.idle)
        # `module.requires_grad = False` (an attribute that freezes nothing)
        self.watchers.append(ModuleAttrWatcher(rec))
        # optimizer-owned parameters replaced in their module (new Parameter, new submodule)
        self.watchers.append(ParamLifeWatcher(rec, self.optimizers.owned_pids()))
        # DistributedDataParallel all-reduces and no_sync, DistributedSampler epochs
        rec.subscribe("describe_loss", self.ddp.describe_loss)
        rec.subscribe("stepped", self.ddp.after_step)
        rec.subscribe("params_added", self.ddp.params_added)
        self.watchers.append(self.ddp)
        # torch.compile: keep all of the above out of compiled graphs
        self.compile = CompileWatcher(rec)
        self.watchers.append(self.compile)
        # every update's gradient norms, only when a picture is asked for (the HTML report...)
        self.grad_flow = GradFlowWatcher(rec) if grad_flow else None
        self._named: set[int] = set()  # optimizers whose parameters were named at their first step
        self.step_threads: set[int] = set()  # the threads the optimizers' first steps ran in
        self._script_globals: dict | None = None  # the script's variables (``name_from``)
        self._unregistered: set[int] = set()  # pids an ``unregistered`` event has named
        rec.subscribe("stepped", self._name_after_first_step)
        rec.subscribe("params_added", self._name_at_construction)
        rec.subscribe("leaf_tracked", self._name_new_leaf)

    def _name_at_construction(self, opt, pids) -> None:
        # from the variables of the constructing frames only (no gc scan): a model that lives in
        # a thread's or a function's locals may never step where another thread can see it
        rec = self.rec
        if any(p not in rec.param_names for p in pids):
            name_parameters(rec, use_gc=False)

    def _name_after_first_step(self, opt, optimizer) -> None:
        # modules are alive now (they may be gone when a main() function has returned), and held
        # by the stepping frame's variables: each optimizer's first step, as models trained in
        # threads are each seen only from their own thread's stack
        if opt not in self._named:
            first = not self._named
            self._named.add(opt)
            self.step_threads.add(threading.get_ident())
            rec = self.rec
            live = LiveModules()  # one heap scan at most for both
            if first or any(p not in rec.param_names for p in rec.opt_params.get(opt, ())):
                name_parameters(rec, live=live)
            # plain lists of modules: while the model is alive (main() may return before the end)
            find_unregistered(rec, user_variables(rec), self.optimizers.owned_pids(),
                              self._unregistered, live)

    def _name_new_leaf(self) -> None:
        # a learnable tensor left out of the optimizer, tracked at its second backward: named,
        # and found in its module, while the model is surely alive (rare: once per such tensor)
        rec = self.rec
        try:
            live = LiveModules()
            name_parameters(rec, live=live)
            find_unregistered(rec, user_variables(rec), self.optimizers.owned_pids(),
                              self._unregistered, live)
        except Exception as exc:
            rec.internal_error("naming a tensor", exc)

    def name_from(self, variables: dict | None) -> None:
        """The script's variables once it has run: parameters still unnamed on exit are named
        after them first (held until then only)."""
        self._script_globals = variables

    def __enter__(self) -> "Instrumentation":
        try:
            for watcher in self.watchers:
                watcher.install(self.patcher)
        except BaseException:
            self.patcher.undo()
            raise
        return self

    def detach_in_child(self) -> None:
        """In a child the script forked: every patch and hook removed, so that the child runs
        the rest of the script as plain python (its copy of the trace is never reported)."""
        self.patcher.undo()

    def __exit__(self, *exc) -> None:
        rec = self.rec
        if self.grad_flow is not None:
            self.grad_flow.close()  # its events before the trace is final
        try:
            rec.finish()  # held events out, Deferred values read: rec.trace is the final trace
        except Exception as error:
            rec.internal_error("reading deferred device values", error)
        try:
            variables, self._script_globals = self._script_globals, None
            live = LiveModules()
            name_parameters(rec, variables or {}, live=live)
            find_unregistered(rec, variables, self.optimizers.owned_pids(), self._unregistered, live)
            emit_param_events(rec)
        except Exception as error:
            rec.internal_error("naming parameters", error)
        for error in self.patcher.undo():
            rec.internal_error("removing instrumentation", error)
