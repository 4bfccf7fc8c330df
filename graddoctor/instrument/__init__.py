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
from .compile import CompileWatcher, tensor_attrs_loaded, tensor_attrs_read_inside
from .constloss import ConstantLossWatcher
from .copies import CopyWatcher
from .fieldrows import FieldRowsWatcher
from .aggsum import AggregateSumWatcher
from .customfn import CustomFunctionWatcher
from .dependency import DependencyWatcher
from .dataloader import DEFAULT_EPOCH_BATCHES, DataLoaderWatcher
from .ddp import DDPWatcher
from .dropout import FunctionalDropoutWatcher
from .functional import FunctionalGradWatcher
from .gradgraph import GradGraphWatcher
from .gradflow import GradFlowWatcher
from .factorcast import FactorBroadcastWatcher
from .handloss import HandLossWatcher
from .targetcolumn import TargetColumnWatcher
from .fullrows import FullRowsWatcher
from .constlabels import ConstantTargetsWatcher
from .gradstop import GradStopWatcher
from .reducebatch import ReduceBatchWatcher
from .classaxis import ClassAxisWatcher
from .idle import IdleParamWatcher
from .liveness import GraphLivenessWatcher
from .loss_inputs import LossInputWatcher
from .realindex import RealIndexWatcher
from .lossdomain import LossDomainWatcher
from .losscalls import LossCalls
from .promptmask import PromptMaskWatcher
from .losses import LossShapeWatcher
from .maskmean import MaskedMeanWatcher
from .maskvisible import MaskedVisibleWatcher
from .deadterm import DeadTermWatcher
from .flowidentity import FlowIdentityWatcher
from .logdetpositions import LogDetPositionsWatcher
from .lossterms import LogScaleWatcher, LossTermWatcher, ZeroWeightWatcher
from .lossderived import LossDerivedWeightWatcher
from .lossweight import LearnedWeightWatcher
from .batchreduce import BatchReductionWatcher
from .constantterm import ConstantTermWatcher
from .modes import ModeWatcher
from .lategrads import LateGradWatcher
from .naming import ParamNamer
from .optdefaults import DefaultsWatcher
from .optim import OptimizerWatcher
from .lossnodes import CompositeLossWatcher
from .patcher import Patcher, forget_check_tables, remove_check_hooks
from .phases import PhaseHold
from .policygrad import AdvantageGradWatcher
from .policysign import PolicySignWatcher
from .degreenorm import DegreeNormWatcher
from .selfscatter import SelfScatterWatcher
from .tokencopy import TokenCopyWatcher
from .unshuffle import UnshuffleWatcher
from .tokenlabels import TokenLabelsWatcher
from .adversarial import AdversarialWatcher
from .entropysign import EntropySignWatcher
from .follow import remove_leftover_modes
from .freshsample import FreshSampleWatcher
from .batchtarget import BatchTargetWatcher
from .ratios import RatioWatcher
from .reparam import ReparamWatcher
from .precision import PrecisionWatcher
from .recorder import Recorder
from .resets import ParamResetWatcher
from .hookstack import HookStackWatcher
from .rng import RngSeedWatcher
from .snapshots import SnapshotWatcher
from .statecarry import StateCarryWatcher
from .stopgrad import TargetGradWatcher
from .redrawn import RedrawnNoiseWatcher
from .cumorder import CumulativeOrderWatcher
from .returnorder import ReturnOrderWatcher
from .drawtwin import DrawTwinWatcher
from .attnaxis import SoftmaxAxisWatcher
from .streamaxis import StreamAxisWatcher
from .pairlabels import TripletOrderWatcher
from .repeatedloss import RepeatedLossWatcher
from .repeatedterm import RepeatedTermWatcher
from .viewaxes import ViewAxesWatcher
from .softmaxbatch import SoftmaxBatchWatcher
from .gatherbatch import GatherBatchWatcher
from .loglikesign import LogLikelihoodSignWatcher
from .reducedweight import ReducedWeightWatcher
from .shiftcancel import ShiftCancelWatcher
from .pairpull import PairPullWatcher
from .negsample import NegativeSampleWatcher
from .concave import ConcaveTermWatcher
from .normbatch import NormBatchWatcher
from .samplepush import SamplePushWatcher
from .featurevar import FeatureVarianceWatcher
from .spreadloss import SpreadLossWatcher
from .anchors import AnchorAliasWatcher
from .weightedits import WeightEditWatcher
from .selfcopy import SelfCopyWatcher
from .shuffles import ShuffleWatcher
from .inputwrite import InputWriteWatcher
from .constraints import ConstraintWatcher
from .samevalue import SameValueWatcher
from .registration import ModuleAttrWatcher, ParamLifeWatcher, TensorAttrWatcher
from .stop import ReplayTimeout, StepLimitReached, StopReplay
from .batchpairs import BatchPairWatcher
from .datasetreads import DatasetReadWatcher
from .augalign import AugmentAlignWatcher
from .causalread import CausalReadWatcher
from .pixelscale import PixelScaleWatcher
from .gridscale import GridScaleWatcher
from .bagoffsets import BagOffsetsWatcher
from .channelpool import ChannelPoolWatcher
from .normsign import NormaliserSignWatcher
from .distancebias import DistanceBiasWatcher
from .easyweight import EasyWeightWatcher
from .overlapscores import OverlapScoresWatcher
from .handweights import HandWeightWatcher
from .ignoredmask import IgnoredMaskWatcher
from .padmask import PaddingMaskWatcher
from .cellswap import CellSwapWatcher
from .placeholders import LogTargetWatcher, PlaceholderTargetWatcher
from .flipalign import FlipAlignWatcher
from .targetmap import TargetRemapWatcher
from .dropoutout import DropoutOutputWatcher
from .discarded import DiscardedOutputWatcher
from .linearstack import LinearStackWatcher
from .topics import (BATCH_SERVED, DESCRIBE_LOSS, FREEZE_OF, PARAMS_ADDED, STATE_LOADED, STATE_TAKEN,
                     STEP_BEGINS, STEP_NORMS, STEPPED, STEPPED_WITHOUT_GRAD)
from .schedulers import SchedulerWatcher
from .symmetry import SymmetryWatcher
from .maskonce import MaskOnceWatcher
from .stcancel import StraightThroughWatcher
from .undo import StepEditWatcher
from .decay import DecayShareWatcher
from .epsshare import EpsShareWatcher
from .saturation import SaturationWatcher
from .warnsource import WarningSource

__all__ = ["Instrumentation", "Recorder", "StopReplay", "StepLimitReached", "ReplayTimeout"]


def _load_before_patching() -> None:
    """Load the modules of torch that the watchers' installation loads (the DDP watcher's FSDP)
    before any patch is in place: FSDP loads torch's sharded-tensor ops, whose table is keyed by
    the tensor methods as they are at that moment (``torch.Tensor.requires_grad_``): loaded
    under the patches, it kept a wrapper as a key for the rest of the process, and with it the
    check its closure reaches."""
    try:
        import torch.distributed.fsdp  # noqa: F401
    except Exception:  # a build without distributed support
        pass


class Instrumentation:
    def __init__(self, rec: Recorder, epoch_batches: int = DEFAULT_EPOCH_BATCHES,
                 grad_flow: bool = False):
        self.rec = rec
        self.patcher = Patcher()
        # per-check tables (patcher.per_check) start empty: the wrappers of builtins made from
        # here share one copy of torch's names, no retired wrapper of another check is known
        forget_check_tables()
        # made before the watchers that read their state; installed in the order of ``watchers``
        self.scalers = GradScalerWatcher(rec)
        self.ddp = DDPWatcher(rec)
        self.optimizers = OptimizerWatcher(rec, self.scalers)
        self.backward = BackwardWatcher(rec, self.optimizers, aside=self.ddp)  # FSDP2's aside
        self.dataloader = DataLoaderWatcher(rec, epoch_batches)
        self.watchers = [WarningSource(), self.optimizers, self.backward, self.dataloader]
        # the step budget of a loop without a DataLoader held to the end of the first pass of
        # the loop around it, or to its first evaluation (after the DataLoader's hold)
        self.phases = PhaseHold(rec, self.dataloader)
        # AMP, clipping, schedulers
        rec.subscribe(DESCRIBE_LOSS, self.dataloader.describe_loss)
        rec.subscribe(DESCRIBE_LOSS, self.scalers.describe_loss)
        self.watchers += [self.scalers, ClipWatcher(rec, self.optimizers.edit_factors),
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
        attention_masks = AttentionMaskWatcher(rec)
        self.watchers.append(attention_masks)
        rec.subscribe(DESCRIBE_LOSS, attention_masks.describe_loss)  # reversed masks held till then
        # a padding mask that keeps exactly the padded positions of the token batches the
        # attention mask watcher saw embedded (mask-keeps-padding): the first backwards' graphs
        padding_masks = PaddingMaskWatcher(rec, attention_masks)
        rec.subscribe(DESCRIBE_LOSS, padding_masks.describe_loss)
        self.watchers.append(padding_masks)
        # the loss wrappers tell five watchers of their calls (instrument/losscalls.py): the
        # idle-parameter watcher (subscribed below: a loss computed from a module whose
        # parameters never get a gradient), the constant-loss watcher (calls on values with no
        # graph), and those of a target that is a column of the input or every row of a
        # full-batch label tensor, and targets that are one value at every call
        self.idle = IdleParamWatcher(rec)
        constants = ConstantLossWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, constants.describe_loss)
        self.watchers.append(constants)
        columns = TargetColumnWatcher(rec)
        rows = FullRowsWatcher(rec)
        one_value = ConstantTargetsWatcher(rec, self.dataloader)
        rec.subscribe(BATCH_SERVED, one_value.served)
        # the same loss term twice in one objective (loss-term-repeated): keyed at the calls,
        # confirmed in the graph of the first backwards
        repeats = RepeatedLossWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, repeats.describe_loss)
        self.watchers.append(repeats)
        # any term summed into the loss twice (hand-written ones too): read from the graph at the
        # backwards after the first optimizer steps, the copy's line from the forward before
        repeated_terms = RepeatedTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, repeated_terms.describe_loss)
        rec.subscribe(STEPPED, repeated_terms.after_step)
        self.watchers.append(repeated_terms)
        # labels that ignore the responses and train on the prompts (prompt-mask-inverted)
        prompts = PromptMaskWatcher(rec)
        self.watchers.append(prompts)
        # regression targets that hold a fill value where there is nothing to regress
        # (placeholder-targets-trained): told by the loss wrappers, first calls only
        placeholders = PlaceholderTargetWatcher(rec)
        # loss targets that are the served labels remapped off their meaning (a void value made
        # a class, classes shifted onto ignore_index, a standardised target scaled again):
        # the latest batches against the loss wrappers' first calls
        remaps = TargetRemapWatcher(rec)
        rec.subscribe(BATCH_SERVED, remaps.served)
        self.watchers.append(remaps)  # its F.interpolate wrapper: label maps resized in the loop
        loss_calls = LossCalls(self.idle, constants, columns, rows, one_value, repeats, prompts,
                               placeholders, remaps, attention_masks)
        # an ignore_index or padding_idx that the data uses as a real class or token: told
        # by the loss and embedding wrappers of loss_inputs.py, which know the pad ids
        real_index = RealIndexWatcher(rec)
        self.watchers += [FunctionalDropoutWatcher(rec, self.modes), LossShapeWatcher(rec, loss_calls),
                          LossInputWatcher(rec, loss_calls, real_index), real_index,
                          LossDomainWatcher(rec),  # targets outside the domain a loss reads them in
                          TripletOrderWatcher(rec)]  # a triplet's positive that is its negative reordered
        # loss targets that carry gradient into the input's parameters (target-not-detached)
        targets = TargetGradWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, targets.describe_loss)
        self.watchers.append(targets)
        # attention weights normalised over another axis than the next matmul sums (softmax-wrong-axis)
        softmax_axis = SoftmaxAxisWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, softmax_axis.describe_loss)
        self.watchers.append(softmax_axis)
        # a language model's token batch viewed out of its 1-D stream along the wrong axis
        # (token-stream-interleaved): the graph of the first backwards walked, no wrapper
        stream_axis = StreamAxisWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, stream_axis.describe_loss)
        self.watchers.append(stream_axis)
        # a view/reshape that puts the axes in another order where a transpose was meant
        # (view-reorders-axes): Tensor.view/reshape wrapped until the first backwards
        view_axes = ViewAxesWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, view_axes.describe_loss)
        self.watchers.append(view_axes)
        # inputs and labels put in two different random orders (rows-shuffled-apart)
        shuffles = ShuffleWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, shuffles.describe_loss)
        self.watchers.append(shuffles)
        # a forward that writes into its input where the input is the script's data
        # (input-written-in-place): outermost module calls' version counters, no wrapper
        input_write = InputWriteWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, input_write.describe_loss)
        self.watchers.append(input_write)
        # a softmax over dim 0 of per-sample outputs on the loss's path (softmax-over-batch):
        # the graph of the first backwards walked, no wrapper
        softmax_batch = SoftmaxBatchWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, softmax_batch.describe_loss)
        self.watchers.append(softmax_batch)
        # a logsumexp, max, min or prod over dim 0 of per-sample scores on the loss's path
        # (reduced-over-batch): the graph of the first backwards walked, its candidates hooked
        reduce_batch = ReduceBatchWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, reduce_batch.describe_loss)
        self.watchers.append(reduce_batch)
        # a gather along dim 0 of per-sample scores with class or action numbers as its index
        # (gather-over-batch): the graph of the first backwards walked, no wrapper
        gather_batch = GatherBatchWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, gather_batch.describe_loss)
        self.watchers.append(gather_batch)
        # a hand-written log-likelihood of the served labels minimised, its minus missing
        # (loss-maximised): the loss's linear top walked at the first backwards, no wrapper
        loglik_sign = LogLikelihoodSignWatcher(rec)
        rec.subscribe(BATCH_SERVED, loglik_sign.served)
        rec.subscribe(DESCRIBE_LOSS, loglik_sign.describe_loss)
        self.watchers.append(loglik_sign)
        # per-sample factors multiplied into a loss torch already reduced over the batch
        # (weights-on-reduced-loss): the graph of the first backwards walked, no wrapper
        weighted_reduced = ReducedWeightWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, weighted_reduced.describe_loss)
        self.watchers.append(weighted_reduced)
        # class scores normalised over another axis than the one the loss picks the class along
        # (class-axis-mismatch): the graph of the first backwards walked, no wrapper
        class_axis = ClassAxisWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, class_axis.describe_loss)
        self.watchers.append(class_axis)
        # a term added alike to every class before a softmax, which cancels it
        # (logit-shift-cancels): Tensor arithmetic wrapped until the first backwards
        shift_cancel = ShiftCancelWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, shift_cancel.describe_loss)
        self.watchers.append(shift_cancel)
        # a product M @ H divided by the sums of M's columns instead of its rows
        # (aggregate-divided-by-column-sums): the divisions wrapped until the first backwards
        aggregate_sum = AggregateSumWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, aggregate_sum.describe_loss)
        self.watchers.append(aggregate_sum)
        # a pairwise loss whose gradient pushes same-label pairs apart or pulls different-label
        # pairs together (pair-pull-reversed): label comparisons and pairwise matrices wrapped
        # until the first backwards, the matrices' gradients read by tensor hooks. Installed
        # first, so that its wrappers are the innermost: the watchers that wrap the same Tensor
        # ops and find their caller a fixed number of frames up still find it there
        pair_pull = PairPullWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, pair_pull.describe_loss)
        rec.subscribe(STEPPED, pair_pull.after_step)
        self.watchers.insert(0, pair_pull)
        # a per-sample loss whose gradient pushes its hardest samples' loss up (hard-samples-
        # pushed-up): the torch losses wrapped until the first backwards, their unreduced
        # results' gradients read by tensor hooks; innermost too, for the same reason
        sample_push = SamplePushWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, sample_push.describe_loss)
        self.watchers.insert(0, sample_push)
        # a per-sample norm taken over the batch and pulled to a target (norm-over-batch): the
        # norm calls wrapped and the loss's graph walked at the first backwards
        norm_batch = NormBatchWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, norm_batch.describe_loss)
        self.watchers.append(norm_batch)
        # a variance meant per feature over the batch, taken per sample and pulled to a target
        # (variance-across-features): the loss's graph walked at the first backwards
        feature_var = FeatureVarianceWatcher(rec, self.dataloader)
        rec.subscribe(DESCRIBE_LOSS, feature_var.describe_loss)
        self.watchers.append(feature_var)
        # a loss that is only a batch's spread around its own mean (loss-is-batch-spread): the
        # loss's top walked at the first backwards
        spread_loss = SpreadLossWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, spread_loss.describe_loss)
        self.watchers.append(spread_loss)
        # a masked per-element loss averaged over every position, padding included
        # (masked-mean-counts-padding): Tensor.mean/sum wrapped until the first backwards
        masked_mean = MaskedMeanWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, masked_mean.describe_loss)
        self.watchers.append(masked_mean)
        # a masked reconstruction loss that counts the positions the model sees
        # (masked-target-visible): module hooks and the loss's graph at the first backwards
        masked_visible = MaskedVisibleWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, masked_visible.describe_loss)
        rec.subscribe(STEPPED, masked_visible.after_step)
        self.watchers.append(masked_visible)
        # a regression target that is the first random draw after the forward (noise-target-redrawn)
        redrawn = RedrawnNoiseWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, redrawn.describe_loss)
        self.watchers.append(redrawn)
        # a cumulative op that runs in another order than its loss needs (cumulative-out-of-order)
        cumulative = CumulativeOrderWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, cumulative.describe_loss)
        self.watchers.append(cumulative)
        # per-step policy-gradient weights in the reverse of the episode's order (returns-reversed)
        returns = ReturnOrderWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, returns.describe_loss)
        self.watchers.append(returns)
        # a draw given to the model in the place of its twin the input was built from
        # (conditioning-drawn-twice): a mode from the first draw to the backward, first windows
        twins = DrawTwinWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, twins.describe_loss)
        self.watchers.append(twins)
        # a penalty's anchor that is the live parameters (anchor-aliases-params)
        anchors = AnchorAliasWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, anchors.describe_loss)
        rec.subscribe(STEPPED, anchors.after_step)
        self.watchers.append(anchors)
        # stepped weights edited in place between two backwards that add up (grads-accumulated-across-weight-edit)
        edits = WeightEditWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, edits.describe_loss)
        rec.subscribe(STEP_BEGINS, edits.before_step)
        rec.subscribe(STEPPED, edits.after_step)
        self.watchers.append(edits)
        # a weight copy taken without clone() written back onto its parameter (weight-copy-aliases-params)
        self_copies = SelfCopyWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(STEPPED, self_copies.after_step)
        self.watchers.append(self_copies)
        # a loss that compares a value with itself: twin views, negatives = positives (loss-compares-with-itself)
        same = SameValueWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, same.describe_loss)
        rec.subscribe(STEPPED, same.after_step)
        self.watchers.append(same)
        # policy-gradient weights that carry gradient into other parameters (advantage-not-detached)
        advantages = AdvantageGradWatcher(rec, self.optimizers.owned_pids())
        rec.subscribe(DESCRIBE_LOSS, advantages.describe_loss)
        self.watchers.append(advantages)
        # a policy-gradient term minimised along the critic's advantage (policy-gradient-reversed)
        policy_signs = PolicySignWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, policy_signs.describe_loss)
        self.watchers.append(policy_signs)
        # a graph's propagation matrix scaled up by the degrees (adjacency-scaled-by-degree)
        degree_norm = DegreeNormWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, degree_norm.describe_loss)
        self.watchers.append(degree_norm)
        # messages scattered back to the nodes they were gathered from (messages-sent-back-to-source)
        self_scatter = SelfScatterWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, self_scatter.describe_loss)
        self.watchers.append(self_scatter)
        # token targets that are a recurrent model's own input ids (target-visible-to-model)
        token_copy = TokenCopyWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, token_copy.describe_loss)
        self.watchers.append(token_copy)
        unshuffle = UnshuffleWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, unshuffle.describe_loss)
        self.watchers.append(unshuffle)
        # tagger labels one position off their tokens (token-labels-shifted)
        token_labels = TokenLabelsWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, token_labels.describe_loss)
        self.watchers.append(token_labels)
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
        # a regression target that holds a reduction over the batch of a model's output
        # (target-reduced-over-batch): followed in the first backwards' turns
        batch_target = BatchTargetWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, batch_target.describe_loss)
        self.watchers.append(batch_target)
        # loss terms -exp(v), -v**2 that leave the loss unbounded below (loss-unbounded-below),
        # a variance written with a plus (variance-sign-flipped) and a matrix times itself held
        # to a constant (orthogonality-without-transpose)
        terms = LossTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, terms.describe_loss)
        self.watchers.append(terms)
        # loss terms in groups that share no parameter (loss-term-trains-nothing)
        dead_terms = DeadTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, dead_terms.describe_loss)
        self.watchers.append(dead_terms)
        # a piecewise-linear term that takes its negative side everywhere (loss-term-concave):
        # torch.where, minimum and products with constants wrapped until the first backwards
        concave = ConcaveTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, concave.describe_loss)
        self.watchers.append(concave)
        # a log-scale held linearly and through exp(+-s) pulling the same way (log-det-sign-reversed)
        rec.subscribe(DESCRIBE_LOSS, LogScaleWatcher(rec).describe_loss)
        # a log-det of a transform shared over an image's positions counted once
        # (log-det-misses-positions)
        rec.subscribe(DESCRIBE_LOSS, LogDetPositionsWatcher(rec).describe_loss)
        # a coupling flow whose layers leave some coordinates of the data untransformed
        # (flow-dimension-untransformed)
        rec.subscribe(DESCRIBE_LOSS, FlowIdentityWatcher(rec).describe_loss)
        # scores of embeddings looked up at randomly drawn indices, and which way the loss
        # pushes them (sampled-negatives-pushed-up): random draws wrapped, node hooks on the
        # scores at the first backwards
        negatives = NegativeSampleWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, negatives.describe_loss)
        rec.subscribe(STEPPED, negatives.after_step)
        self.watchers.append(negatives)
        # learned loss weights that only a monotone factor of losses reaches (loss-weight-learned-to-zero)
        learned_weights = LearnedWeightWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, learned_weights.describe_loss)
        self.watchers.append(learned_weights)
        # loss weights computed from the loss terms with their graph (loss-weight-from-loss)
        derived_weights = LossDerivedWeightWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, derived_weights.describe_loss)
        self.watchers.append(derived_weights)
        # one loss term summed over the batch, another averaged over it (loss-terms-mixed-reduction)
        batch_reduction = BatchReductionWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, batch_reduction.describe_loss)
        self.watchers.append(batch_reduction)
        constant_terms = ConstantTermWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, constant_terms.describe_loss)
        self.watchers.append(constant_terms)
        # terms of the loss multiplied by 0 at every backward (loss-weight-rounds-to-zero)
        rec.subscribe(DESCRIBE_LOSS, ZeroWeightWatcher(rec).describe_loss)
        # a hand-written squared or absolute error whose target broadcast it to every pair
        rec.subscribe(DESCRIBE_LOSS, HandLossWatcher(rec).describe_loss)
        # per-sample weights, advantages or masks that broadcast against the terms they weigh
        rec.subscribe(DESCRIBE_LOSS, FactorBroadcastWatcher(rec).describe_loss)
        # gradients taken with create_graph=True that no backward differentiates
        # (grad-graph-unused); before FunctionalGradWatcher, whose wrapper then goes around
        # this one's and finds the user's frame where it expects it
        grad_graphs = GradGraphWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, grad_graphs.describe_loss)
        rec.subscribe(STEPPED, grad_graphs.after_step)
        self.watchers.append(grad_graphs)
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
        # what a dataset's __getitem__ writes into or reads from the arrays it holds
        self.watchers.append(DatasetReadWatcher(rec))
        # a dataset's augmentation that moves an image's pixels and not its mask's the same way
        self.watchers.append(AugmentAlignWatcher(rec))
        # a recurrent state carried from one batch of a shuffling DataLoader to the next
        carried = StateCarryWatcher(rec, self.dataloader)
        rec.subscribe(BATCH_SERVED, carried.served)
        rec.subscribe(DESCRIBE_LOSS, carried.describe_loss)
        self.watchers.append(carried)
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
        # sampling grids given to F.grid_sample in pixel units or in [0, 1] (first calls only)
        grids = GridScaleWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, grids.describe_loss)
        self.watchers.append(grids)
        # EmbeddingBag offsets that are no running start positions (first calls only)
        bags = BagOffsetsWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, bags.describe_loss)
        self.watchers.append(bags)
        # a sparse target map (0 = missing) read through torch.log by a hand-written loss
        # (placeholder-targets-trained): torch.log / Tensor.log wrapped for the first backwards
        log_targets = LogTargetWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, log_targets.describe_loss)
        self.watchers.append(log_targets)
        # a batch and its dense target flipped along different axes in the loop
        # (augmentation-misaligned): the flips of the first backwards' turns
        flips = FlipAlignWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, flips.describe_loss)
        self.watchers.append(flips)
        # a convolution's output pooled over its channels and fed to a Linear
        # (pooled-over-channels): the graph of the first backwards walked, no wrapper
        channel_pool = ChannelPoolWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, channel_pool.describe_loss)
        self.watchers.append(channel_pool)
        # a normaliser summed from signed features (normaliser-changes-sign) and a causal
        # attention that prefers its farthest keys (attention-prefers-distant-keys): the graph
        # of the first backwards walked, no wrapper
        normaliser_sign = NormaliserSignWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, normaliser_sign.describe_loss)
        self.watchers.append(normaliser_sign)
        distance_bias = DistanceBiasWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, distance_bias.describe_loss)
        self.watchers.append(distance_bias)
        # a focal-style weight that falls as the loss rises (easy-examples-upweighted): the
        # graph of the first backwards walked, no wrapper
        easy = EasyWeightWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, easy.describe_loss)
        self.watchers.append(easy)
        # a soft dice/IoU ratio over scores that go below 0 (overlap-on-raw-scores): the graph
        # of the first backwards walked, no wrapper
        overlap = OverlapScoresWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, overlap.describe_loss)
        self.watchers.append(overlap)
        # a per-class table looked up by the labels and multiplied into a per-sample
        # cross-entropy, growing with the classes' frequency (class-weights-inverted, by hand):
        # the graph of the first backwards walked, no wrapper
        hand_weights = HandWeightWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, hand_weights.describe_loss)
        self.watchers.append(hand_weights)
        # a dice-style term masked to the pixels the cross-entropy ignores
        # (loss-on-ignored-pixels): the graph of the first backwards walked, no wrapper
        ignored_mask = IgnoredMaskWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, ignored_mask.describe_loss)
        self.watchers.append(ignored_mask)
        # a dense map read at the transposed cells of its loss's positives
        # (cells-read-transposed): the graph of the first backwards walked, no wrapper
        cells = CellSwapWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, cells.describe_loss)
        self.watchers.append(cells)
        # a loss that reads a dropout layer's output directly (first backwards only)
        dropped = DropoutOutputWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, dropped.describe_loss)
        self.watchers.append(dropped)
        # a module call inside the model's forward whose output never reaches the loss (first
        # backwards only)
        discarded = DiscardedOutputWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, discarded.describe_loss)
        self.watchers.append(discarded)
        # two nn.Linear layers with nothing nonlinear between them (first backwards only)
        stacked = LinearStackWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, stacked.describe_loss)
        self.watchers.append(stacked)
        # graphs of earlier backwards the script keeps referenced (a running total of losses)
        rec.subscribe(DESCRIBE_LOSS, GraphLivenessWatcher(rec).describe_loss)
        # where the gradient of parameters that get exactly zero stops (grads-always-zero)
        stops = GradStopWatcher(rec)
        rec.subscribe(STEP_NORMS, stops.step_norms)
        rec.subscribe(DESCRIBE_LOSS, stops.describe_loss)
        self.watchers.append(stops)
        # layers whose units stay copies of each other (symmetric-units)
        self.watchers.append(SymmetryWatcher(rec))  # STEPPED until each optimizer is checked
        # 0/1 masks applied to a weight once and never kept up (mask-applied-once; first steps only)
        self.watchers.append(MaskOnceWatcher(rec))
        # straight-through sums x + (y - x) without .detach() (first backwards only)
        straight = StraightThroughWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, straight.describe_loss)
        self.watchers.append(straight)
        # hand edits between steps that undo the update (params-reset-every-step)
        self.watchers.append(StepEditWatcher(rec))  # the step topics until each optimizer is measured
        # a clamp, mask or norm bound written between backward and step, then broken by the step
        self.watchers.append(ConstraintWatcher(rec))  # the step topics for each optimizer's first steps
        # a weight decay many times the loss's gradient in the first updates (weight-decay-dominates-update)
        self.watchers.append(DecayShareWatcher(rec))  # STEP_BEGINS until each optimizer is measured
        # an adaptive optimizer whose eps outweighs sqrt(v) in its own state (eps-dominates-update)
        self.eps = EpsShareWatcher(rec)  # STEPPED until each optimizer is measured
        self.watchers.append(self.eps)
        # copies of the model meant to follow it: EMA teachers, target networks (copy-never-follows)
        self.copies = CopyWatcher(rec, self.optimizers.owned_pids())  # the step topics while it has work
        self.watchers.append(self.copies)
        # categorical fields looked up in one shared table without their offsets
        # (embedding-fields-share-rows): F.embedding wrapped, judged at the end of the run
        self.field_rows = FieldRowsWatcher(rec)
        self.watchers.append(self.field_rows)
        # hyper-parameters written into an optimizer's defaults, which its step never reads
        # (optimizer-attribute-hyperparameter)
        self.watchers.append(DefaultsWatcher(rec))
        # parameters unfrozen after the graph walks, whose gradients no optimizer owns
        # (param-not-in-optimizer): swept at the first steps, then at doubling counts
        self.watchers.append(LateGradWatcher(rec))
        # where the parameters that never get a gradient are used (param-without-grad)
        rec.subscribe(STEPPED_WITHOUT_GRAD, self.idle.after_step)
        self.watchers.append(self.idle)
        # `module.requires_grad = False`, `p.requires_grad_ = False` (attributes that freeze
        # nothing), `model.eval = True` (a mode switched by nobody); after the mode watcher,
        # whose requires_grad_ the tensor one hands on to and whose layer numbers the module
        # one names
        self.watchers += [ModuleAttrWatcher(rec, self.modes), TensorAttrWatcher(rec)]
        # optimizer-owned parameters replaced in their module (new Parameter, new submodule)
        self.watchers.append(ParamLifeWatcher(rec, self.optimizers.owned_pids()))
        # stepped parameters set back by nn.init or load_state_dict (params-reset-every-step)
        self.resets = resets = ParamResetWatcher(rec, self.optimizers.owned_pids())
        self.watchers.append(resets)
        # state dicts that are no copies, restored or saved after a step (snapshot-aliases-params):
        # Module.state_dict and torch.save are its own; load_state_dict tells it (the reset
        # watcher's wrapper)
        snapshots = SnapshotWatcher(rec)
        rec.subscribe(STATE_LOADED, snapshots.loading)
        rec.subscribe(STATE_TAKEN, resets.taken)  # a trained state saved before a reload
        self.watchers.append(snapshots)
        # tanh/sigmoid saturated from the initialisation at the first steps (activations-saturated);
        # after the reset watcher: its nn.init wrappers go around that watcher's
        self.saturation = SaturationWatcher(rec)
        rec.subscribe(STEPPED, self.saturation.after_step)
        rec.subscribe(DESCRIBE_LOSS, self.saturation.describe_loss)
        self.watchers.append(self.saturation)
        # RNN / attention modules built with batch_first=False given batch-first input
        self.watchers.append(BatchFirstWatcher(rec, self.dataloader))
        # DistributedDataParallel all-reduces and no_sync, DistributedSampler epochs
        rec.subscribe(DESCRIBE_LOSS, self.ddp.describe_loss)
        rec.subscribe(STEPPED, self.ddp.after_step)
        rec.subscribe(PARAMS_ADDED, self.ddp.params_added)
        self.watchers.append(self.ddp)
        # hooks registered again on one parameter or module, the earlier copies kept (hook-stacked):
        # after DependencyWatcher, so that a user's register_hook call reaches this wrapper first
        self.watchers.append(HookStackWatcher(rec))
        # the top nodes of losses torch builds of plain ops (l1_loss, kl_div...) tagged for
        # ``lossnodes.loss_of``; its DESCRIBE_LOSS after every reader's: it takes the tags off.
        # Installed first, under the other watchers' wrappers of those losses: theirs are
        # ``watched`` frames that call it, which its window's end rebuilds around torch's own
        # function (``patcher.put_back``), and their own ``unwatch`` still finds them on top
        composite_losses = CompositeLossWatcher(rec)
        rec.subscribe(DESCRIBE_LOSS, composite_losses.describe_loss)
        self.watchers.insert(0, composite_losses)
        # torch.compile: keep all of the above out of compiled graphs
        self.compile = CompileWatcher(rec)
        self.watchers.append(self.compile)
        # every update's gradient norms, only when a picture is asked for (the HTML report...)
        self.grad_flow = GradFlowWatcher(rec) if grad_flow else None
        # parameter names after the user's variables, at the moments the models are alive
        self.namer = ParamNamer(rec, self.optimizers)
        # a later training phase (an optimizer given parameters after the loss-graph windows
        # closed) opens them again: instrument/losswindow.py
        for watcher in self.loss_window_holders():
            rec.subscribe(PARAMS_ADDED, watcher.loss_window.params_added)

    def loss_window_holders(self) -> list:
        """The watchers that hold a ``loss_window`` (instrument/losswindow.py)."""
        return [w for w in self.watchers if getattr(w, "loss_window", None) is not None]

    def __enter__(self) -> "Instrumentation":
        self._tensor_attrs_loaded = tensor_attrs_loaded()
        _load_before_patching()
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
        self.field_rows.close()
        self.eps.close()
        self.saturation.close()
        self.resets.close()  # a checkpoint overwritten before the first step
        try:
            rec.finish()  # held events out, Deferred values read: rec.trace is the final trace
        except Exception as error:
            rec.internal_error("reading deferred device values", error)
        self.namer.close()
        for error in [*self.patcher.undo(), *remove_check_hooks()]:
            rec.internal_error("removing instrumentation", error)
        # the tables of this check's wrappers let go of, so that nothing of a finished check
        # (wrappers, their watchers, the recorder, the script's model) outlives it
        forget_check_tables()
        try:
            tensor_attrs_read_inside(self._tensor_attrs_loaded)
        except Exception as error:
            rec.internal_error("removing instrumentation", error)
        try:
            remove_leftover_modes()
        except Exception as error:
            rec.internal_error("removing instrumentation", error)
