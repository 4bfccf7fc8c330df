"""Install every hook and wrapper in one place; remove them all on exit.

``Instrumentation`` is a context manager around the user's run. Each watcher owns one area
(backward, optimizers, data loading, ...) and installs itself through a shared ``Patcher`` so
that leaving the context restores torch exactly as it was, also after a crash.
"""

from __future__ import annotations

from .amp import GradScalerWatcher
from .attnmask import AttentionMaskWatcher
from .batchfirst import BatchFirstWatcher
from .backward import BackwardWatcher
from .clip import ClipWatcher
from .compile import CompileWatcher
from .constloss import ConstantLossWatcher
from .copies import CopyWatcher
from .corruption import CorruptedTargetWatcher
from .customfn import CustomFunctionWatcher
from .dependency import DependencyWatcher
from .dataloader import DEFAULT_EPOCH_BATCHES, DataLoaderWatcher
from .ddp import DDPWatcher
from .dropout import FunctionalDropoutWatcher
from .functional import FunctionalGradWatcher
from .gradflow import GradFlowWatcher
from .handloss import HandLossWatcher
from .targetcolumn import TargetColumnWatcher
from .fullrows import FullRowsWatcher
from .gradstop import GradStopWatcher
from .idle import IdleParamWatcher
from .liveness import GraphLivenessWatcher
from .loss_inputs import LossInputWatcher
from .lossdomain import LossDomainWatcher
from .losscalls import LossCalls
from .losses import LossShapeWatcher
from .lossterms import LossTermWatcher, ZeroWeightWatcher
from .modes import ModeWatcher
from .naming import ParamNamer
from .optim import OptimizerWatcher
from .patcher import Patcher
from .policygrad import AdvantageGradWatcher
from .adversarial import AdversarialWatcher
from .entropysign import EntropySignWatcher
from .freshsample import FreshSampleWatcher
from .ratios import RatioWatcher
from .reparam import ReparamWatcher
from .precision import PrecisionWatcher
from .recorder import Recorder
from .resets import ParamResetWatcher
from .rng import RngSeedWatcher
from .snapshots import SnapshotWatcher
from .stopgrad import TargetGradWatcher
from .redrawn import RedrawnNoiseWatcher
from .attnaxis import SoftmaxAxisWatcher
from .viewaxes import ViewAxesWatcher
from .anchors import AnchorAliasWatcher
from .samevalue import SameValueWatcher
from .registration import ModuleAttrWatcher, ParamLifeWatcher
from .stop import ReplayTimeout, StepLimitReached, StopReplay
from .batchpairs import BatchPairWatcher
from .causalread import CausalReadWatcher
from .pixelscale import PixelScaleWatcher
from .dropoutout import DropoutOutputWatcher
from .topics import (BATCH_SERVED, DESCRIBE_LOSS, FREEZE_OF, PARAMS_ADDED, STATE_LOADED, STATE_TAKEN,
                     STEP_BEGINS, STEP_NORMS, STEPPED, STEPPED_WITHOUT_GRAD)
from .schedulers import SchedulerWatcher
from .symmetry import SymmetryWatcher
from .undo import StepEditWatcher
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
        rec.subscribe(DESCRIBE_LOSS, self.dataloader.describe_loss)
        rec.subscribe(DESCRIBE_LOSS, self.scalers.describe_loss)
        self.watchers += [self.scalers, ClipWatcher(rec),
                          SchedulerWatcher(rec)]  # grad edits: OptimizerWatcher's step pass
        # BatchNorm/dropout modes
        self.modes = ModeWatcher(rec, self.optimizers.owned_pids())
        self.watchers.append(self.modes)
        rec.subscribe(FREEZE_OF, self.modes.freeze_seq)  # a frozen param's step names its freeze
        # functional dropout left on in eval mode; regression losses that broadcast;
        # classification losses given probabilities where logits or log-probabilities belong
        # attention masks in the other convention, or 0/1 masks added to the scores (before the
        # dropout watcher: its F.scaled_dot_product_attention wrapper, which reads its caller's
        # frame, goes around this one)
        self.watchers.append(AttentionMaskWatcher(rec))
        # the loss wrappers tell four watchers of their calls (instrument/losscalls.py): the
        # idle-parameter watcher (subscribed below: a loss computed from a module whose
        # parameters never get a gradient), the constant-loss watcher (calls on values with no
        # graph), and those of a target that is a column of the input or every row of a
        # full-batch label tensor
        self.idle = IdleParamWatcher(rec)
        constants = ConstantLossWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, constants.describe_loss)
        columns = TargetColumnWatcher(rec)
        rows = FullRowsWatcher(rec)
        # a target that is the corrupted value the model was given (target-is-corrupted-input):
        # its mode follows values from the start, so it is installed before the other watchers
        # that push modes of their own
        corrupted = CorruptedTargetWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, corrupted.describe_loss)
        self.watchers.append(corrupted)
        loss_calls = LossCalls(self.idle, constants, columns, rows, corrupted)
        self.watchers += [FunctionalDropoutWatcher(rec), LossShapeWatcher(rec, loss_calls),
                          LossInputWatcher(rec, loss_calls),
                          LossDomainWatcher(rec)]  # targets outside the domain a loss reads them in
        # loss targets that carry gradient into the input's parameters (target-not-detached)
        targets = TargetGradWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, targets.describe_loss)
        self.watchers.append(targets)
        # attention weights normalised over another axis than the next matmul sums (softmax-wrong-axis)
        softmax_axis = SoftmaxAxisWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, softmax_axis.describe_loss)
        self.watchers.append(softmax_axis)
        # a view/reshape that puts the axes in another order where a transpose was meant
        # (view-reorders-axes): Tensor.view/reshape wrapped until the first backwards
        view_axes = ViewAxesWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, view_axes.describe_loss)
        self.watchers.append(view_axes)
        # a regression target that is the first random draw after the forward (noise-target-redrawn)
        redrawn = RedrawnNoiseWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, redrawn.describe_loss)
        self.watchers.append(redrawn)
        # a penalty's anchor that is the live parameters (anchor-aliases-params)
        anchors = AnchorAliasWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, anchors.describe_loss)
        rec.subscribe(STEPPED, anchors.after_step)
        self.watchers.append(anchors)
        # a loss that compares a value with itself: twin views, negatives = positives (loss-compares-with-itself)
        same = SameValueWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, same.describe_loss)
        rec.subscribe(STEPPED, same.after_step)
        self.watchers.append(same)
        # policy-gradient weights that carry gradient into other parameters (advantage-not-detached)
        advantages = AdvantageGradWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, advantages.describe_loss)
        self.watchers.append(advantages)
        # a generator trained toward the discriminator's target for its samples (first backwards)
        adversarial = AdversarialWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, adversarial.describe_loss)
        rec.subscribe(STEPPED, adversarial.after_step)
        self.watchers.append(adversarial)
        # an entropy bonus with the wrong sign (entropy-minimised)
        entropies = EntropySignWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, entropies.describe_loss)
        self.watchers.append(entropies)
        # importance ratios that cancel or are inverted, clipped surrogates minimised
        ratios = RatioWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, ratios.describe_loss)
        self.watchers.append(ratios)
        # samples without gradient used where the reparameterised one is meant
        reparam = ReparamWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, reparam.describe_loss)
        self.watchers.append(reparam)
        # a policy gradient on the log_prob of a second, unused sample (log-prob-of-fresh-sample)
        fresh = FreshSampleWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, fresh.describe_loss)
        self.watchers.append(fresh)
        # loss terms -exp(v), -v**2 that leave the loss unbounded below (loss-unbounded-below)
        terms = LossTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, terms.describe_loss)
        self.watchers.append(terms)
        # terms of the loss multiplied by 0 at every backward (loss-weight-rounds-to-zero)
        rec.subscribe(DESCRIBE_LOSS, ZeroWeightWatcher(rec).describe_loss)
        # a hand-written squared or absolute error whose target broadcast it to every pair
        rec.subscribe(DESCRIBE_LOSS, HandLossWatcher(rec).describe_loss)
        # gradients taken with torch.autograd.grad / torch.func, which graddoctor does not follow
        self.watchers.append(FunctionalGradWatcher(rec))
        # the global RNG seeded (reseed-in-loop)
        self.watchers.append(RngSeedWatcher(rec))
        # custom autograd.Functions: each class's backward checked once against its forward
        self.watchers.append(CustomFunctionWatcher(rec))
        # half-precision parameters: an eps that rounds to 0, updates below the dtype's resolution
        self.watchers.append(PrecisionWatcher(rec))
        # what the model's output depends on (samples-mixed-in-batch, target-visible-to-model):
        # one extra autograd.grad at the first backwards, before any watcher hooks the graph
        dependency = DependencyWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, dependency.describe_loss)
        rec.subscribe(PARAMS_ADDED, dependency.params_added)  # a new model: the window again
        self.watchers.append(dependency)
        # inputs and targets from one DataLoader batch, in one order (first turns, CPU)
        pairs = BatchPairWatcher(rec)
        rec.subscribe(BATCH_SERVED, pairs.served)
        rec.subscribe(DESCRIBE_LOSS, pairs.describe_loss)
        self.watchers.append(pairs)
        # a causal sequence module's output read only where it has seen part of the sequence
        causal = CausalReadWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, causal.describe_loss)
        rec.subscribe(STEPPED, causal.after_step)
        self.watchers.append(causal)
        # raw 0..255 pixels given to the model's first layer (first steps only)
        pixels = PixelScaleWatcher(rec)
        rec.subscribe(STEPPED, pixels.after_step)
        rec.subscribe(DESCRIBE_LOSS, pixels.describe_loss)
        self.watchers.append(pixels)
        # a loss that reads a dropout layer's output directly (first backwards only)
        dropped = DropoutOutputWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, dropped.describe_loss)
        self.watchers.append(dropped)
        # graphs of earlier backwards the script keeps referenced (a running total of losses)
        rec.subscribe(DESCRIBE_LOSS, GraphLivenessWatcher(rec).describe_loss)
        # where the gradient of parameters that get exactly zero stops (grads-always-zero)
        stops = GradStopWatcher(rec)
        rec.subscribe(STEP_NORMS, stops.step_norms)
        rec.subscribe(DESCRIBE_LOSS, stops.describe_loss)
        self.watchers.append(stops)
        # layers whose units stay copies of each other (symmetric-units)
        symmetry = SymmetryWatcher(rec)
        rec.subscribe(STEPPED, symmetry.after_step)
        self.watchers.append(symmetry)
        # hand edits between steps that undo the update (params-reset-every-step)
        edits = StepEditWatcher(rec)
        rec.subscribe(STEP_BEGINS, edits.before_step)
        rec.subscribe(STEPPED, edits.after_step)
        self.watchers.append(edits)
        # copies of the model meant to follow it: EMA teachers, target networks (copy-never-follows)
        self.copies = CopyWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(STEP_BEGINS, self.copies.before_step)
        rec.subscribe(STEPPED, self.copies.after_step)
        self.watchers.append(self.copies)
        # where the parameters that never get a gradient are used (param-without-grad)
        rec.subscribe(STEPPED_WITHOUT_GRAD, self.idle.after_step)
        self.watchers.append(self.idle)
        # `module.requires_grad = False` (an attribute that freezes nothing)
        self.watchers.append(ModuleAttrWatcher(rec))
        # optimizer-owned parameters replaced in their module (new Parameter, new submodule)
        self.watchers.append(ParamLifeWatcher(rec, self.optimizers.owned_pids()))
        # stepped parameters set back by nn.init or load_state_dict (params-reset-every-step)
        resets = ParamResetWatcher(rec, self.optimizers.owned_pids())
        self.watchers.append(resets)
        # state dicts that are no copies, restored or saved after a step (snapshot-aliases-params):
        # Module.state_dict and torch.save are its own; load_state_dict tells it (the reset
        # watcher's wrapper)
        snapshots = SnapshotWatcher(rec)
        rec.subscribe(STATE_LOADED, snapshots.loading)
        rec.subscribe(STATE_TAKEN, resets.taken)  # a trained state saved before a reload
        self.watchers.append(snapshots)
        # RNN / attention modules built with batch_first=False given batch-first input
        self.watchers.append(BatchFirstWatcher(rec, self.dataloader))
        # DistributedDataParallel all-reduces and no_sync, DistributedSampler epochs
        rec.subscribe(DESCRIBE_LOSS, self.ddp.describe_loss)
        rec.subscribe(STEPPED, self.ddp.after_step)
        rec.subscribe(PARAMS_ADDED, self.ddp.params_added)
        self.watchers.append(self.ddp)
        # torch.compile: keep all of the above out of compiled graphs
        self.compile = CompileWatcher(rec)
        self.watchers.append(self.compile)
        # every update's gradient norms, only when a picture is asked for (the HTML report...)
        self.grad_flow = GradFlowWatcher(rec) if grad_flow else None
        # parameter names after the user's variables, at the moments the models are alive
        self.namer = ParamNamer(rec, self.optimizers)

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
        self.copies.close()
        try:
            rec.finish()  # held events out, Deferred values read: rec.trace is the final trace
        except Exception as error:
            rec.internal_error("reading deferred device values", error)
        self.namer.close()
        for error in self.patcher.undo():
            rec.internal_error("removing instrumentation", error)
