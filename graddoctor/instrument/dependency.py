"""What a model's output depends on: samples mixed across the batch, the target visible to it.

Two families of silent bugs break an invariant that one backward through the model's own graph
can test ("use backprop to chart dependencies"):

* **Samples mixed across the batch.** The output for sample ``i`` must not depend on sample
  ``j != i``. ``x.view(T, B, F)`` where ``x.transpose(0, 1)`` was meant, ``softmax(dim=0)``,
  ``F.normalize(z, dim=0)``, a ``flip``/``roll`` of dim 0 all break it.
* **The target visible to the model.** With next-token targets (``targets[t] == ids[t + 1]``),
  the output at position ``t`` must not depend on input positions after ``t`` (a decoder
  without a causal mask, an inverted mask, a bidirectional RNN used as a language model); with
  targets that are not shifted (``targets == ids``) or shifted the wrong way, a causal model is
  trained to predict a token it already reads.

How, and what it costs:

* From the start of the run, a global module forward pre-hook and forward hook are registered
  (torch's ``register_module_forward_pre_hook`` / ``register_module_forward_hook``; made from
  source under inlinable.py's file name, so that Dynamo inlines them and calls nothing of
  graddoctor's in a compiled graph). They note the outermost forwards of trainable models in
  train mode with gradients on, on the CPU: the inputs, the output (its first tensor, a
  ``.logits``), the first outputs of the submodules called inside, the ids and outputs of the
  ``nn.Embedding`` layers, and the calls of attention, Transformer and recurrent modules (where
  a causal mask goes). They are removed at the first backward at which no new model was noted
  (the second, in a loop over one model), at ``PROBES`` probes, ``MAX_BACKWARDS`` backwards or
  ``MAX_FORWARDS`` outermost forwards, and before ``torch.compile`` runs (or a model compiled
  before the check is called: torch warns about global hooks there). Then nothing of this
  watcher is on the step's path but the loss functions' wrappers (one attribute read). An
  optimizer given parameters later (``PARAMS_ADDED``: a second stage's model, a new trial)
  opens the window again until the next backward that brings no new model, a few times per
  run, never after ``torch.compile``.
* At the next backward (``DESCRIBE_LOSS``, before the real backward runs; subscribed before the
  watchers that hook the graph themselves) one extra ``torch.autograd.grad`` of a random-weighted
  projection of one output row (one position of a sequence output) is taken with respect to the
  recorded tensors, ``retain_graph=True``: it touches no ``.grad`` (the ``inputs`` are non-leaf
  tensors, so no ``AccumulateGrad`` node and no parameter hook runs) and leaves the graph to the
  user's backward. Its weights come from a private ``torch.Generator``. When the batch size is
  known, the graph's nodes on the way get a hook (``Node.register_hook``, removed when the call
  returns) that notes the node whose incoming gradient is clean (only the probed row non-zero)
  while a gradient it passes on is not: the op that mixes the samples. BatchNorm, batch
  statistics (``std``/``var``: a minibatch-stddev layer), matrix products (a graph's ``adj @ h``,
  attention) and gathers (mixup's ``x[perm]``) mix on purpose: their gradient is cleaned to the
  probed row and the search goes on above (a view that splits ``(B * k, ...)`` rows back into
  ``(B, k, ...)`` reads its input's samples in blocks of ``k`` rows: ``_blocks``) (batch statistics of another layout leave the probe
  blind: nothing is judged). A mixing op counts when a recorded ``(B, ...)`` tensor above it gets
  a mixed gradient too, or when it is one of the ops that mix a batch only by mistake (a view, a
  softmax, a norm...). When one is found, the model's next forward runs with anomaly mode's
  tracebacks on (``torch.set_anomaly_enabled(True, False)``: no NaN checks, no warning) and is
  probed again, which names the line that made the node.
* The sequence axis: the targets of the loss calls since the last backward (``cross_entropy``,
  ``nll_loss``) against the ids of the forward's embeddings: a shift ``k`` in {1, 0, -1, 2} that
  matches at least 90 % of the positions the loss does not ignore, ids not constant, the output
  laid out ``(batch, positions, ...)`` like those ids. A loss position is compared at the
  model position its logits come from: the slices, ``narrow``s, integer indexing and transposes
  between the model's output and the loss's input are followed (``_loss_positions``: a prompt
  left out, ``model(x)[:, P - 1:]``, is not a second shift). The probed position ``t = (T - 1) // 2``
  tells whether the output there depends on later positions and on earlier ones.
* Skipped, silently: anything not on the CPU; a DDP/FSDP/DataParallel model or a process group;
  a compiled model or submodule; a graph with a Python ``autograd.Function`` node (custom
  Functions, reentrant checkpointing, module backward hooks) or made under saved-tensor hooks
  (non-reentrant checkpointing); tensor hooks or ``retain_grad`` since the last backward; more
  than ``_NODES`` graph nodes; an output that does not lead with the batch, or is ``(B, B)``
  (CLIP's similarities); a batch size that is not known (the DataLoader's, a loss target's
  laid out unlike the input, or the rows of an (N, D) output that the loss compares with each
  other: metric learning's ``cdist(emb, emb)``, a similarity ``emb @ emb.T``) or that dim 1 of an input equals (``(T, B)`` or ``(B, T)``?). The
  batch test needs the known batch size; the sequence test only the shift. A square token batch
  (``(B, T)`` ids with ``T == B``: 16 sequences of a block of 16) gets the sequence test alone,
  judged only when the probed output row's gradient stays in the same row of the embedded ids
  (``_rows_kept``: dim 0 is the batch; a sequence-first model's reads a column and is skipped).

Each probe is recorded as a ``dependency`` aside event at the user's line that called the model.
"""

from __future__ import annotations

import functools
import re
import sys
import types
import weakref
from threading import get_ident

import torch
import torch.nn.functional as F
from torch import nn

from .. import events as ev
from ..trace import Location
from .patcher import check_hook
from .inlinable import in_transform, watched
from . import seqcopy
from .graphpaths import paths_to, post_order, saved, saved_dims, signed
from .recorder import Recorder

_GRAD = torch.autograd.grad  # torch's own (the functional-grad watcher wraps the attribute)

PROBES = 4  # probes per run (a located probe again included)
MAX_FORWARDS = 16  # outermost forwards watched at most before the hooks go
MAX_BACKWARDS = 4  # backwards after which the hooks go
_NODES = 20000  # graph nodes walked at most (a larger graph is not probed)
_RECORDED = 32  # submodule outputs kept per forward
_MODULES = 8  # attention / recurrent calls kept per forward
_TARGETS = 8  # loss targets kept per turn
_TARGET_VALUES = 1 << 22  # values of a target distribution read as class ids, at most
_MATCH = 0.9  # share of the positions a target shift must match
_MIN_POSITIONS = 8
_READER_CALLS = 256  # calls of recurrent and linear layers on data kept per forward (seqcopy.py)
_READERS = (nn.RNNBase, nn.RNNCellBase, nn.Linear, nn.Conv1d)
_TINY = 1e-6  # a gradient below this share of the largest one counts as zero

LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
          "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div")
_TOKEN_LOSSES = ("cross_entropy", "nll_loss")
# losses whose target may be a distribution over the classes, one row per position
_DISTRIBUTION_LOSSES = ("kl_div", "cross_entropy")
_IGNORED = -100  # a class id no distribution's row names: its all-zero rows (padding)
# a hand-written log-likelihood: the log-probabilities of given tokens picked out of a
# log_softmax by gather (DPO's and a policy's sequence log-probs); its index is the target
_GATHERED = "gather"
_GATHER_NODES = 4000  # nodes of a loss graph looked through for such a gather

# nodes that mix the samples of a batch on purpose: their gradient is cleaned to the probed row.
# "stat": batch statistics (BatchNorm in train mode, a minibatch-stddev layer): a gradient of
# another shape than (B, ...) cannot be cleaned, and the probe is then blind
_STAT = ("NativeBatchNorm", "CudnnBatchNorm", "MiopenBatchNorm", "BatchNorm", "Std", "Var",
         "NativeGroupNorm")
# "mix": products, gathers and scatters (a graph's adjacency, attention, mixup's x[perm], a
# fused recurrent layer; a batch_first mix-up of an RNN or attention is batch-first-mismatch's)
_MIX = ("Mm", "Bmm", "Addmm", "Baddbmm", "Addbmm", "Matmul", "Mv", "Dot", "Einsum", "SparseAddmm",
        "SparseMm", "SparseSparseMatmul", "Index", "IndexSelect", "Gather", "IndexAdd",
        "IndexPut", "Scatter", "ScatterAdd", "ScatterReduce", "Embedding", "EmbeddingBag",
        "ScaledDotProduct", "MkldnnRnnLayer", "CudnnRnn", "MiopenRnn", "Cdist", "Take",
        "MaskedScatter", "SegmentReduce", "Lerp")
# ops that mix the batch only by mistake: one of them seen mixing needs no other confirmation
_SUSPECTS = frozenset({"View", "UnsafeView", "Reshape", "ReshapeAlias", "Permute", "Transpose", "T",
                       "Softmax", "LogSoftmax", "LinalgVectorNorm", "Norm", "Flip", "Roll", "Mean",
                       "Sum", "Amax", "Amin", "Max", "Min", "Logsumexp", "Cumsum", "Cumprod",
                       "Prod", "Unflatten"})
_ATTENTION = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
              nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer)
_RECURRENT = (nn.RNNBase,)
_MASK_KWARGS = ("mask", "src_mask", "tgt_mask", "attn_mask", "is_causal", "tgt_is_causal",
                "src_key_padding_mask")
_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel",
             "OptimizedModule")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _op(name: str) -> str:
    """``SoftmaxBackward0`` -> ``Softmax``."""
    return name.split("Backward", 1)[0]


def _kind(name: str) -> str | None:
    op = _op(name)
    if op.startswith(_STAT):
        return "stat"
    if op in _MIX or op.startswith(("ScaledDotProduct", "Sparse", "Mkldnn", "Cudnn")):
        return "mix"
    return None


def _first_tensor(value):
    """The tensor a model's output stands for: itself, ``.logits`` (a ModelOutput), a dict's
    ``logits``, the first tensor of a tuple or list."""
    if isinstance(value, torch.Tensor):
        return value
    logits = getattr(value, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(value, dict):
        logits = value.get("logits")
        if isinstance(logits, torch.Tensor):
            return logits
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value[:4]:
            if isinstance(item, torch.Tensor):
                return item
    return None


class _Forward:
    """One outermost training forward of a model, recorded for a probe."""

    __slots__ = ("model", "cls", "call", "forward", "inputs", "out", "outs", "embeds",
                 "modules", "unsafe", "anomaly", "locate", "packed", "readers")

    def __init__(self, model, call, locate: bool):
        self.model = model
        self.cls = type(model).__name__
        self.call = call
        code = getattr(getattr(type(model), "forward", None), "__code__", None)
        self.forward = [code.co_filename, code.co_firstlineno] if code is not None else None
        self.inputs: list = []
        self.out = None
        self.outs: list = []  # submodule outputs that lead with the batch
        self.embeds: list = []  # (ids, output) of nn.Embedding layers
        self.modules: list = []  # [cls, Location, flags] of attention / recurrent calls
        self.unsafe: str | None = None
        self.anomaly = None  # the anomaly mode to put back at the forward's end
        self.locate = locate
        # an RNN ran over a PackedSequence: its data interleaves the samples by time step, and
        # pad_packed_sequence regroups those rows in views whose layout the probe cannot read
        self.packed = False
        self.readers: list = []  # seqcopy.reader_call's records, with the line of each call


class DependencyWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self.active = False  # the window: the global module hooks are registered
        self._patcher = None
        self._reopened = 0
        self._compiled = False  # torch.compile was called: the window never opens again
        self._handles: list = []
        self._depth = 0
        self._current: _Forward | None = None
        self._pending: list[_Forward] = []
        self._done: dict[int, object] = {}  # id(model) -> the model (weakly: see _seen)
        self._locate: dict[int, tuple] = {}  # id(model) -> (op, index) to locate at its next forward
        # (target, fn, ignore_index, Location, the loss input's node) since the last backward
        self._targets: list[tuple] = []
        self._hooked = False  # a tensor hook or retain_grad since the last backward
        self._probes = 0
        self._forwards = 0
        self._backwards = 0

    # -- the window ------------------------------------------------------------------------
    def params_added(self, opt: int, pids: list) -> None:
        """PARAMS_ADDED: an optimizer was given parameters — a model trained from now on (a
        second stage, a new trial) opens the window again, until its first backward."""
        if self.active or self._compiled or self._probes >= PROBES or self._reopened >= PROBES \
                or self._patcher is None:
            return
        try:
            self._reopened += 1
            self._open()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("dependency probe (reopen)", exc)

    def _open(self) -> None:
        self._handles = register_module_hooks(self._patcher, self._pre, self._post)
        self.active = True
        self._depth = 0
        self._forwards = 0
        self._backwards = 0

    def _stop(self) -> None:
        self.active = False
        self._drop()
        self._pending = []
        self._targets = []
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _seen(self, model) -> bool:
        held = self._done.get(id(model))
        return held is not None and held() is model

    # -- module hooks (only while the window is open) ---------------------------------------
    def _pre(self, module, args):
        if get_ident() != self.rec.script_thread:
            return None
        depth = self._depth
        self._depth = depth + 1
        try:
            if depth == 0:
                self._top(module)
            elif self._current is not None:
                self._inner(module)
        except Exception as exc:
            self._drop()
            self.rec.internal_error("dependency probe (forward)", exc)
        return None

    def _post(self, module, args, *rest):
        # (kwargs, output); a forward that raised calls an always_call hook with (result) only
        if get_ident() != self.rec.script_thread:
            return None
        kwargs, output = rest if len(rest) == 2 else ({}, rest[-1] if rest else None)
        self._depth = max(0, self._depth - 1)
        current = self._current
        if current is None:
            return None
        try:
            if self._depth == 0:
                if module is current.model:
                    self._top_done(current, args, kwargs, output)
            else:
                self._inner_done(current, module, args, kwargs, output)
        except Exception as exc:
            self._drop()
            self.rec.internal_error("dependency probe (forward end)", exc)
        return None

    def _drop(self) -> None:
        """Forget the forward being recorded (and put anomaly mode back if it was set)."""
        current, self._current = self._current, None
        if current is not None and current.anomaly is not None:
            torch.set_anomaly_enabled(*current.anomaly)
            current.anomaly = None

    def _top(self, module) -> None:
        if not self.active:
            return
        self._forwards += 1
        if self._forwards > MAX_FORWARDS:
            self._stop()
            return
        if not (module.training and torch.is_grad_enabled()) or torch.is_inference_mode_enabled():
            return
        rec = self.rec
        if rec.running_backwards and rec.in_backward():
            return  # a checkpoint's recomputation inside the backward
        locate = id(module) in self._locate
        if (self._seen(module) and not locate) or any(p.model is module for p in self._pending):
            return
        if type(module).__name__ in _WRAPPERS or _distributed():
            return
        param = next((p for p in module.parameters() if p.requires_grad), None)
        if param is None or param.device.type != "cpu":
            return
        current = _Forward(module, self.rec.here(), locate)
        if locate and not torch.is_anomaly_enabled():
            current.anomaly = (False, torch.is_anomaly_check_nan_enabled())
            torch.set_anomaly_enabled(True, False)
        self._current = current

    def _inner(self, module) -> None:
        current = self._current
        if module._backward_hooks or module._backward_pre_hooks:
            current.unsafe = "module backward hooks"
        elif type(module).__name__ in _WRAPPERS:
            current.unsafe = "a compiled or wrapped submodule"
        elif torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
            current.unsafe = "saved-tensor hooks (checkpointing)"

    def _inner_done(self, current: _Forward, module, args, kwargs, output) -> None:
        if isinstance(module, nn.Embedding):
            ids = args[0] if args else kwargs.get("input")
            if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point() \
                    and isinstance(output, torch.Tensor) and output.requires_grad \
                    and output.grad_fn is not None and len(current.embeds) < _MODULES:
                current.embeds.append((ids, output))
            return
        if isinstance(module, _READERS) and len(current.readers) < _READER_CALLS:
            call = seqcopy.reader_call(module, args, output)
            if call is not None:
                call["at"] = self.rec.here()
                current.readers.append(call)
        if isinstance(module, _ATTENTION + _RECURRENT):
            if args and isinstance(args[0], nn.utils.rnn.PackedSequence):
                current.packed = True
            if len(current.modules) < 4 * _MODULES:
                current.modules.append([type(module).__name__, self.rec.here(),
                                        _flag(module, args, kwargs), self._depth])
        if len(current.outs) >= _RECORDED:
            return
        out = _first_tensor(output)
        if isinstance(out, torch.Tensor) and out.requires_grad and out.grad_fn is not None \
                and out.dim() >= 1:
            current.outs.append(out)

    def _top_done(self, current: _Forward, args, kwargs, output) -> None:
        self._drop()
        out = _first_tensor(output)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        inputs += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
        if current.unsafe is not None or not isinstance(out, torch.Tensor) or out.dim() == 0 \
                or not out.requires_grad or out.grad_fn is None or out.device.type != "cpu" \
                or not inputs or inputs[0].dim() == 0:
            return
        current.inputs = inputs
        current.out = out
        if isinstance(current.model, _READERS) and not current.readers:
            call = seqcopy.reader_call(current.model, args, output)  # nn.Linear(W, H) itself
            if call is not None:
                call["at"] = current.call
                current.readers.append(call)
        self._pending.append(current)

    # -- loss targets and tensor hooks --------------------------------------------------------
    def _wrap_loss(self, original, fn: str):
        watcher = self

        def before(args, kwargs) -> None:
            if not watcher.active:
                return
            try:
                target = args[1] if len(args) > 1 else kwargs.get("target")
                if isinstance(target, torch.Tensor) and target.dim() and len(watcher._targets) < _TARGETS:
                    ignore = kwargs.get("ignore_index", args[4] if len(args) > 4 and fn in _TOKEN_LOSSES else -100)
                    given = args[0] if args else kwargs.get("input")
                    watcher._targets.append((target, fn, ignore if isinstance(ignore, int) else -100,
                                             watcher.rec.here(), getattr(given, "grad_fn", None)))
            except Exception as exc:
                watcher.rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)
        prepare = getattr(original, "__prepare_scriptable__", None)
        loss.__prepare_scriptable__ = prepare or (lambda: original)
        return loss

    def _wrap_hook(self, original):
        watcher = self

        def method(tensor, *args, **kwargs):
            if watcher.active:
                watcher._hooked = True
            return original(tensor, *args, **kwargs)

        method.__name__ = getattr(original, "__name__", "hook")
        method.__doc__ = getattr(original, "__doc__", None)
        return method

    # -- DESCRIBE_LOSS: the probe -----------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self.active:
            return {}
        try:
            self._backwards += 1
            pending, self._pending = self._pending, []
            targets, self._targets = self._targets, []
            hooked, self._hooked = self._hooked, False
            if self._current is not None:  # a backward inside a forward: not ours to judge
                pending = []
            if pending and len(targets) < _TARGETS:
                targets += _gathered_targets(tensors, _TARGETS - len(targets))
            for forward in pending:
                if self._probes >= PROBES:
                    break
                key = id(forward.model)
                locate = self._locate.pop(key, None) if forward.locate else None
                if not self._seen(forward.model) or locate is not None:
                    self._done[key] = weakref.ref(forward.model)
                    self._probes += 1
                    if not hooked:
                        self._probe(forward, targets, locate, tensors)
                        if locate is None:
                            try:
                                self._copy_probe(forward, targets)
                            except Exception as exc:
                                self.rec.internal_error("dependency probe (target copied)", exc)
            # the window closes at the first backward with no new model to probe (every model
            # the script trains has made its first training forward by then), or at the limits
            if self._probes >= PROBES or (not self._locate and (
                    self._backwards >= MAX_BACKWARDS or (not pending and self._done))):
                self._stop()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("dependency probe", exc)
        return {}

    def _batch_source(self, forward: _Forward, targets, B: int, tensors=None) -> str | None:
        size = self.loader.batch_size() if self.loader is not None else None
        if size == B:
            return "loader"
        first = forward.inputs[0]
        for target, _, _, _, _ in targets:
            if int(target.shape[0]) != B:
                continue
            if target.dim() >= 2 and first.dim() >= 2 and tuple(target.shape[:2]) == tuple(first.shape[:2]):
                continue  # laid out like the input: (B, T) and (T, B) read alike
            return "loss_target"
        if tensors is not None and forward.out.dim() == 2 and _rows_compared(tensors, forward.out):
            return "pairwise"
        return None

    def _probe(self, forward: _Forward, targets, locate, tensors=None) -> None:
        out = forward.out
        B = int(out.shape[0])
        first = forward.inputs[0]
        if B < 2 or int(first.shape[0]) != B:
            return
        if out.dim() >= 2 and int(out.shape[1]) == B and (out.dim() == 2 or not forward.embeds):
            return  # (B, B) scores: a similarity matrix (CLIP) mixes the batch by design (a
            # (B, T, V) output of embedded (B, T) ids with T == B: the sequence test below)
        source = self._batch_source(forward, targets, B, tensors) if not forward.packed else None
        square = False  # a (B, T) token batch with T == B: the probe's gradient tells the batch
        if any(t.dim() >= 2 and int(t.shape[1]) == B for t in forward.inputs) and not (
                source == "pairwise" and all(t.dim() == 2 for t in forward.inputs)):
            # (T, B, ...) or (B, T, ...) with T == B: which one is the batch? (a (B, F) input
            # whose (B, D) output's rows the loss compares with each other: the rows). Only the
            # sequence is judged, once the gradient of output row r is seen to stay in row r of
            # the embedded ids (dim 0 the batch: no sample reads another)
            square = True
            source = None
        seq = self._sequence(forward, targets, out)
        if square and seq is None:
            return
        if source is None and seq is None:
            return
        inputs, seen = [], set()
        # without a known batch size only the sequence is judged: the embeddings suffice, and
        # no node is hooked
        recorded = [e[1] for e in forward.embeds] + (forward.outs if source is not None else [])
        for tensor in recorded:
            if tensor is not out and id(tensor) not in seen:
                seen.add(id(tensor))
                inputs.append(tensor)
        if not inputs:
            return
        walk = _walk(out.grad_fn, inputs)
        if walk is None:
            return  # too large, or a Python autograd.Function on the way
        relevant = walk
        r = (B - 1) // 2
        state = _State(B, r)
        handles = []
        try:
            if source is not None:
                for node, edges in relevant.items():
                    handles.append(check_hook(node.register_hook(state.hook(node, edges))))
            t = seq["t"] if seq is not None else None
            gen = torch.Generator().manual_seed(0x5EED)
            with torch.enable_grad():
                row = out[r] if t is None else out[r, t]
                weights = torch.randn(row.shape, generator=gen, dtype=torch.float32).to(row.dtype)
                projection = (row * weights).sum()
            try:
                grads = _GRAD(projection, inputs, retain_graph=True, allow_unused=True)
            except RuntimeError:
                return  # the graph was freed already (a second model's backward), or cannot run
        finally:
            for handle in handles:
                handle.remove()
        dirty = any(g is not None and not _clean(g, B, r) for g in grads)
        mixed = None
        op = op_at = None
        if source is not None and not state.blind:
            # the mixing op is confirmed by a recorded (B, ...) tensor upstream whose gradient
            # is mixed too, or is one of the ops that mix a batch by mistake (a view, a
            # softmax, a norm over dim 0...): nothing upstream may lead with the batch
            mixed = bool(state.introduced) and (dirty or _op(state.introduced[0].name()) in _SUSPECTS)
            if mixed:
                node = state.introduced[0]
                op = node.name()
                op_at = _traceback_location(self.rec, node)
                if op_at is None and self._probes < PROBES and not forward.locate:
                    self._locate[id(forward.model)] = (op,)
        if seq is not None:
            by_id = {id(e[1]): g for e, g in zip(forward.embeds, grads)}
            if square and not _rows_kept(by_id.get(id(forward.embeds[seq["embedding"]][1])), r):
                return
            self._judge_sequence(seq, by_id, forward, r)
            if "future" not in seq:
                seq = None
        if mixed is None and seq is None:
            return
        rec = self.rec
        modules = [[m[0], m[1].path, m[1].line, m[1].function, m[2]]
                   for m in _outermost(forward.modules) if m[1] is not None][:_MODULES]
        rec.emit_aside(ev.dependency(
            model=forward.cls, batch=B, source=source, mixed=mixed, op=op,
            op_at=[op_at.path, op_at.line, op_at.function] if op_at is not None else None,
            seq=seq, modules=modules,
            forward=[rec.finder.display_path(forward.forward[0]), forward.forward[1]]
            if forward.forward is not None and rec.finder.is_user_file(forward.forward[0]) else None),
            forward.call)

    # -- a real-valued target copied from the input (seqcopy.py) ---------------------------
    def _copy_probe(self, forward: _Forward, targets) -> None:
        """Whether the prediction at one target position reads that target's values at the
        last input step it reads: one extra gradient, taken only when a target position's
        values are found among the data a recurrent or linear layer of the model read."""
        out = forward.out
        lines = seqcopy.timelines(forward.readers) if forward.readers and out is not None else []
        if not lines:
            return
        chosen = None
        for target, fn, _, loc, _ in reversed(targets):
            if fn not in seqcopy.REGRESSION or target.device.type != "cpu" \
                    or target.numel() != out.numel():
                continue
            found = []
            for line in lines:
                x = torch.cat([c["x"] for c in line], 1) if len(line) > 1 else line[0]["x"]
                f = int(x.shape[2])
                if line[0]["kind"] == "conv" and target.dim() == 3 and f > 1 \
                        and int(target.shape[0]) == int(x.shape[0]) and int(target.shape[1]) == f:
                    laid = (target.transpose(1, 2), "channels")  # (batch, channels, steps)
                else:
                    laid = seqcopy.target_layout(target, int(x.shape[0]), f)
                if laid is None:
                    continue
                y, seq_first = laid
                pairs = seqcopy.matches(y, x)
                if pairs:
                    P, S = int(y.shape[1]), int(x.shape[1])
                    whole = P == S and set((t, t) for t in range(P)) <= set(pairs)
                    found.append((line, y.shape, seq_first, pairs, whole))
            if found:
                chosen = (fn, loc, found)
                break
        if chosen is None:
            return
        fn, loc, found = chosen
        _, shape, seq_first, pairs, whole = found[0]
        B, P, f = (int(n) for n in shape)
        found = [c for c in found if tuple(c[1]) == tuple(shape) and c[2] == seq_first]
        t = (P - 1) // 2 if any(c[4] for c in found) else min(tt for c in found for tt, _ in c[3])
        if seq_first == "channels":
            if out.dim() != 3 or int(out.shape[0]) != B:
                return
            laid_out = out.transpose(1, 2)
        elif seq_first:
            if out.dim() < 2 or int(out.shape[1]) != B:
                return
            laid_out = out.transpose(0, 1)
        elif int(out.shape[0]) == B:
            laid_out = out
        else:
            return
        inputs, seen = [], set()
        for tensor in seqcopy.grad_inputs([c[0] for c in found]):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                inputs.append(tensor)
        if not inputs or _walk(out.grad_fn, inputs) is None:
            return
        r = (B - 1) // 2
        gen = torch.Generator().manual_seed(0x5EED)
        with torch.enable_grad():
            row = laid_out.reshape(B, P, f)[r, t]
            weights = torch.randn(row.shape, generator=gen, dtype=torch.float32).to(row.dtype)
            projection = (row * weights).sum()
        try:
            grads = _GRAD(projection, inputs, retain_graph=True, allow_unused=True)
        except RuntimeError:
            return
        by_id = {id(tensor): g for tensor, g in zip(inputs, grads) if g is not None}
        for line, _, _, pairs, whole in found:
            read, last = seqcopy.read_steps(line, by_id, r)
            kind = line[0]["kind"]
            steps = sum(int(c["x"].shape[1]) for c in line)
            s = seqcopy.judge(kind, pairs, t, P, whole, read, last, steps)
            if s is None:
                continue
            x = line[0]["x"]
            given = next((i for i, v in enumerate(forward.inputs)
                          if v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()), None)
            at = line[0]["at"]
            offset, call_at = 0, at
            for call in line:  # the call that read step s
                if offset <= s < offset + int(call["x"].shape[1]):
                    call_at = call["at"]
                    break
                offset += int(call["x"].shape[1])
            rec = self.rec
            copy = {"reader": type(line[0]["module"]).__name__, "kind": kind, "t": t, "s": s,
                    "positions": P, "steps": sum(int(c["x"].shape[1]) for c in line),
                    "whole": whole, "calls": len(line), "input": given, "fn": fn,
                    "reads_after": last is not None and last > s,
                    "read_at": [call_at.path, call_at.line, call_at.function] if call_at is not None else None,
                    "target_at": [loc.path, loc.line, loc.function] if loc is not None else None}
            rec.emit_aside(ev.dependency(
                model=forward.cls, batch=B, source=None, mixed=None, op=None, op_at=None,
                seq={"copy": copy}, modules=[],
                forward=[rec.finder.display_path(forward.forward[0]), forward.forward[1]]
                if forward.forward is not None and rec.finder.is_user_file(forward.forward[0]) else None),
                forward.call)
            return

    # -- the sequence axis ------------------------------------------------------------------
    def _sequence(self, forward: _Forward, targets, out) -> dict | None:
        """The shift of the token targets against an embedding's ids of this forward, when one
        is found and the output lays out (batch, positions, ...) like those ids."""
        if out.dim() < 2 or not forward.embeds:
            return None
        B, T = int(out.shape[0]), int(out.shape[1])
        if T < 3:
            return None
        found = None
        for index, (ids, _) in enumerate(forward.embeds):
            if tuple(ids.shape) != (B, T):
                continue
            flat = ids.reshape(-1)
            if bool((flat == flat[0]).all()):
                continue
            for target, fn, ignore, loc, given in reversed(targets):
                if target.is_floating_point() and fn in _DISTRIBUTION_LOSSES:
                    # a label-smoothed target distribution built by hand (``kl_div`` of the
                    # log-probs against it, ``cross_entropy`` given probabilities): its classes
                    target, ignore = _class_ids(target), _IGNORED
                    if target is None:
                        continue
                if (fn not in _TOKEN_LOSSES and fn not in _DISTRIBUTION_LOSSES and fn != _GATHERED) \
                        or target.is_floating_point() or target.numel() % B:
                    continue
                length = target.numel() // B
                positions = _loss_positions(given, out)
                if positions is _UNREAD or (positions is None and length not in (T, T - 1, T - 2)) \
                        or (positions is not None and len(positions) != length):
                    continue
                k = _shift(ids, target.reshape(B, length), ignore, positions)
                if k is not None and (found is None or (k == 1 and found["k"] != 1)):
                    # a next-token loss beside one of another shift (a multi-token head) is the
                    # model's main target
                    found = {"k": k, "positions": T, "t": (T - 1) // 2, "embedding": index,
                             "target_at": [loc.path, loc.line, loc.function] if loc is not None else None}
                    if fn == _GATHERED:
                        found["gathered"] = True
            if found is not None:
                return found
        return None

    @staticmethod
    def _judge_sequence(seq: dict, by_id: dict, forward: _Forward, r: int) -> None:
        ids, embedded = forward.embeds[seq.pop("embedding")]
        grad = by_id.get(id(embedded))
        if grad is None:
            return
        t = seq["t"]
        with torch.no_grad():
            per = grad[r].detach().abs().reshape(grad.shape[1], -1).amax(1).float()
            top = float(per.max())
            if top == 0.0:
                return
            floor = top * _TINY
            seq["future"] = bool(per[t + 1:].max() > floor)
            seq["past"] = bool(per[:t].max() > floor) if t > 0 else False

    def _before_compile(self) -> None:
        # a graph traced with fullgraph=True cannot call into graddoctor's code either
        self._compiled = True  # the window stays closed
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        self._open()
        for fn in LOSSES:
            original = getattr(F, fn, None)
            if original is not None:
                patcher.patch(F, fn, self._wrap_loss(original, fn))
        patcher.patch(torch.Tensor, "register_hook", self._wrap_hook(torch.Tensor.register_hook))
        patcher.patch(torch.Tensor, "retain_grad", self._wrap_hook(torch.Tensor.retain_grad))


def causal_mask(mask) -> bool:
    """Whether ``mask`` (T, T), as torch's attention reads it, hides exactly the positions after
    each one: boolean True (hidden) strictly above the diagonal, or a float mask whose entries
    above the diagonal are -inf (or a large negative fill) and the others 0. CPU masks only (no
    host sync): a GPU mask is not judged."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[0] != mask.shape[1] \
            or mask.device.type != "cpu" or mask.shape[0] < 2:
        return False
    with torch.no_grad():
        above = torch.ones(mask.shape, dtype=torch.bool).triu(1)
        if mask.dtype is torch.bool:
            return bool(torch.equal(mask, above))
        if not mask.is_floating_point():
            return False
        return bool((mask[above] <= -1e4).all() and (mask[~above] == 0).all())


def _flag(module, args, kwargs) -> str:
    """"bidirectional" for such an RNN; "masked" for an attention or Transformer module called
    with a mask (or ``is_causal``), "causal" when that mask is a causal one (``causal_mask``);
    else ""."""
    if isinstance(module, _RECURRENT):
        return "bidirectional" if getattr(module, "bidirectional", False) else ""
    given = [kwargs.get(k) for k in _MASK_KWARGS if k != "src_key_padding_mask"
             and kwargs.get(k) is not None and kwargs.get(k) is not False]
    if isinstance(module, nn.MultiheadAttention) and len(args) > 5:
        given.append(args[5])
    if given:
        masks = [m for m in given if isinstance(m, torch.Tensor)]
        return "causal" if masks and all(causal_mask(m) for m in masks) else "masked"
    if isinstance(module, nn.MultiheadAttention):
        return ""
    two = isinstance(module, (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer))
    return "masked" if len(args) > (2 if two else 1) and args[2 if two else 1] is not None else ""


def _outermost(modules: list) -> list:
    """The recorded attention / recurrent calls, those nested in another attention module
    (a Transformer's layers and their attention) left out."""
    attention = [m for m in modules if m[0] not in ("RNN", "LSTM", "GRU")]
    top = min((m[3] for m in attention), default=None)
    return [m for m in modules if m[0] in ("RNN", "LSTM", "GRU") or m[3] == top]


# the global hooks, made from source under the file name of inlinable.py's wrappers: Dynamo
# inlines them in a model compiled before the check began (``watch()``), sees is_compiling()
# and calls nothing of graddoctor's (whose folder is on its skip list: fullgraph=True fails).
# One pre and one post hook of torch's for every watcher's module hooks (``ModuleHooks``): each
# call is dispatched to the watchers that take that module's class, in the order they
# registered, with torch's own conventions (a pre hook's non-None return replaces the args, a
# post hook's the output; a post hook that takes no kwargs is called without them; after a
# forward that raised only the ``always_call`` ones run, without kwargs, as torch calls them). The
# pair counts how deep in module calls each thread is: a watcher that looks only at outermost
# calls (``outermost=True``) is not called for the calls nested in them.
def _compiling_parts() -> tuple:
    """``torch.compiler.is_compiling()`` as the pair tests it, in two parts: Dynamo folds
    ``is_dynamo_compiling()`` to True while it traces (so a trace never reads the flag, and no
    guard is put on it), and in eager code ``is_compiling()`` is the module's flag (which
    ``torch.export`` sets): one Python call per hook instead of two (``is_compiling`` calls
    ``torch.jit.is_scripting``), the same answer. A torch without these parts: ``is_compiling``
    itself, with a flag that is never set."""
    compiler = torch.compiler
    dynamo = getattr(compiler, "is_dynamo_compiling", None)
    if dynamo is None or not isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return compiler.is_compiling, types.SimpleNamespace(_is_compiling_flag=False)
    return dynamo, compiler


_COMPILING = _compiling_parts()

_DISPATCH = compile("""
def make(table, is_dynamo_compiling, flags, transform, get_ident):
    depths = table.depths
    nested_pres, outer_pres = table.nested_pres, table.outer_pres
    nested_posts, outer_posts = table.nested_posts, table.outer_posts
    sort = table.sort
    def pre_hook(module, args):
        if is_dynamo_compiling() or flags._is_compiling_flag or transform() is not None:
            return None
        thread = get_ident()
        depth = depths.get(thread, 0)
        depths[thread] = depth + 1
        hooks = (nested_pres if depth else outer_pres).get(module.__class__)
        if hooks is None:
            hooks = sort(module.__class__)[0][0 if depth else 1]
        if not hooks:  # no watcher takes this call (most nested calls)
            return None
        changed = False
        for hook in hooks:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
                changed = True
        return args if changed else None
    def post_hook(module, args, *rest):
        if is_dynamo_compiling() or flags._is_compiling_flag or transform() is not None:
            return None
        thread = get_ident()
        depth = depths.get(thread, 0)
        if depth:
            depth -= 1
            depths[thread] = depth
        hooks = (nested_posts if depth else outer_posts).get(module.__class__)
        if hooks is None:
            hooks = sort(module.__class__)[1][0 if depth else 1]
        if not hooks:
            return None
        changed = False
        if len(rest) == 2:
            kwargs, output = rest
            for hook, with_kwargs, always in hooks:
                result = hook(module, args, kwargs, output) if with_kwargs else hook(module, args, output)
                if result is not None:
                    output = result
                    changed = True
        else:
            output = rest[0] if rest else None
            for hook, with_kwargs, always in hooks:
                if always:
                    result = hook(module, args, output)
                    if result is not None:
                        output = result
                        changed = True
        return output if changed else None
    return pre_hook, post_hook
""", "<graddoctor: watched call>", "exec")


class ModuleHooks:
    """The watchers' global module hooks behind one pre hook and one post hook of torch's (a
    module call costs one dispatch, not one torch hook and one wrapper frame per watcher), in
    torch's dicts only while some watcher holds one (a module call with no hook anywhere takes
    torch's fast path). A watcher may name the module classes it looks at (``classes``): the
    others' calls never reach it (the watchers that want each class are sorted once per class).
    A watcher may also ask for the outermost calls only (``outermost``: the calls no other
    module call on the same thread is running around): the pair counts each thread's depth once
    for all of them, and the calls nested inside never reach it (a model of thousands of modules
    calls them once per forward, not once per module). ``register_module_hooks`` is the way in;
    one table per patcher, which also gets torch's handles of the pair
    (``benchmarks/overhead.py`` suspends them through it)."""

    def __init__(self, patcher=None):
        self._patcher = weakref.ref(patcher) if patcher is not None else None
        # [pre or None, post or None, with_kwargs, always, classes, outermost only]
        self._entries: list[list] = []
        # module class -> the pre hooks that take its calls nested in another module call, in
        # order; the same for its outermost calls; the same two for the (post, with_kwargs,
        # always_call) that take it. Emptied in place when the entries change: the pair holds
        # the dicts themselves (one lookup per call)
        self.nested_pres: dict = {}
        self.outer_pres: dict = {}
        self.nested_posts: dict = {}
        self.outer_posts: dict = {}
        self.depths: dict[int, int] = {}  # thread -> module calls running on it (the pair's count)
        self._torch: list = []  # torch's handles of the dispatching pair, while registered
        scope: dict = {}
        exec(_DISPATCH, scope)
        self._pre_hook, self._post_hook = scope["make"](self, *_COMPILING, in_transform,
                                                        get_ident)

    def sort(self, cls) -> tuple:
        """The pre hooks and post entries that take ``cls`` (nested, outermost), kept for its
        next calls."""
        taking = [e for e in self._entries if e[4] is None or issubclass(cls, e[4])]
        outer_pres = tuple(e[0] for e in taking if e[0] is not None)
        outer_posts = tuple((e[1], e[2], e[3]) for e in taking if e[1] is not None)
        pres = (tuple(e[0] for e in taking if e[0] is not None and not e[5]), outer_pres)
        posts = (tuple((e[1], e[2], e[3]) for e in taking if e[1] is not None and not e[5]),
                 outer_posts)
        self.nested_pres[cls], self.outer_pres[cls] = pres
        self.nested_posts[cls], self.outer_posts[cls] = posts
        return pres, posts

    def _forget_sorted(self) -> None:
        for sorted_ in (self.nested_pres, self.outer_pres, self.nested_posts, self.outer_posts):
            sorted_.clear()

    def add(self, pre, post, with_kwargs: bool, always_call: bool, classes,
            outermost: bool = False) -> "_Entry":
        entry = [pre, post, with_kwargs, always_call, classes, outermost]
        self._entries.append(entry)
        self._forget_sorted()
        if not self._torch:
            self._register()
        return _Entry(self, entry)

    def remove(self, entry: list) -> None:
        if not any(e is entry for e in self._entries):
            return
        self._entries = [e for e in self._entries if e is not entry]
        self._forget_sorted()
        if not self._entries:
            handles, self._torch = self._torch, []
            for handle in handles:
                handle.remove()

    def holds(self, entry: list) -> bool:
        return any(e is entry for e in self._entries)

    def _register(self) -> None:
        from torch.nn.modules import module as module_mod

        self.depths.clear()  # the calls running when the pair last left are not seen ending

        pre = module_mod.register_module_forward_pre_hook(self._pre_hook)
        post = module_mod.register_module_forward_hook(self._post_hook, with_kwargs=True,
                                                       always_call=True)
        # torch's handle forgets the entry it made in ``_global_forward_hooks_with_kwargs``
        # (removing it leaves ``{id: True}`` there, and every later module call then passes its
        # kwargs to a hook that is gone): the handle is told of that dict too
        kwargs_dict = getattr(module_mod, "_global_forward_hooks_with_kwargs", None)
        if kwargs_dict is not None and post.id in kwargs_dict:
            post.extra_dict_ref = (*post.extra_dict_ref, weakref.ref(kwargs_dict))
        self._torch = [pre, post]
        patcher = self._patcher() if self._patcher is not None else None
        if patcher is not None:  # removed again by the patcher at the end: nothing twice
            patcher.handle(pre)
            patcher.handle(post)


class _Entry:
    """A watcher's handle on its hooks in ``ModuleHooks``: ``remove()`` takes them out (again:
    nothing)."""

    __slots__ = ("table", "entry")
    # not a torch hook of its own: torch's handles of the pair are the patcher's too (what
    # benchmarks/overhead.py's suspension takes out)
    follows_a_patch = True

    def __init__(self, table: ModuleHooks, entry: list):
        self.table, self.entry = table, entry

    def remove(self) -> None:
        self.table.remove(self.entry)

    @property
    def active(self) -> bool:
        return self.table.holds(self.entry)


_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # patcher -> its ModuleHooks


def module_hook_table(patcher) -> ModuleHooks:
    """The patcher's ``ModuleHooks`` (made at its first use)."""
    table = _tables.get(patcher)
    if table is None:
        table = _tables[patcher] = ModuleHooks(patcher)
    return table


def register_module_hooks(patcher, pre=None, post=None, *, with_kwargs: bool = True,
                          always_call: bool = True, classes=None, outermost: bool = False) -> list:
    """Hook ``pre(module, args)`` and ``post(module, args, [kwargs,] output)`` (either may be
    None) on every module call, as torch's global module hooks would be (``ModuleHooks``: one
    pair of torch's for all watchers); ``classes``: only the calls of modules of these classes
    (a class or a tuple, as for ``isinstance``); ``outermost``: only the calls that run inside
    no other module call on their thread. Returns one handle (in a list: the watchers remove
    what it holds), also given to ``patcher`` to remove at the end."""
    if pre is None and post is None:
        return []
    entry = module_hook_table(patcher).add(pre, post, with_kwargs, always_call, classes, outermost)
    return [patcher.handle(entry)]


def close_before_compile(patcher, close) -> None:
    """Call ``close`` (which removes a watcher's global module hooks) before ``torch.compile``
    runs, and before the first call of a model compiled before the check began (``watch()``):
    torch.compile warns about global module hooks."""
    def wrap(original):
        def compile(*args, **kwargs):
            close()
            return original(*args, **kwargs)

        return functools.wraps(original)(compile)

    patcher.patch(torch, "compile", wrap(torch.compile))
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if optimized is not None and "__call__" in vars(optimized):
        patcher.patch(optimized, "__call__", wrap(optimized.__call__))


def _distributed() -> bool:
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return True


_PAIRWISE = frozenset({"CdistBackward0", "EuclideanDistBackward0", "MmBackward0"})  # cdist's
# small sizes run as _euclidean_dist
_ROW_VIEWS = frozenset({"TBackward0", "TransposeBackward0", "PermuteBackward0"})


def _rows_compared(tensors, out) -> bool:
    """Does the loss compare the rows of the (N, D) output ``out`` with each other, N >= 4:
    ``torch.cdist(out, out)`` or ``out @ out.T`` (metric learning's distances, a contrastive
    loss's similarities)? Then its rows are the samples, whatever the data told. Graphs of more
    than ``_GATHER_NODES`` nodes are not looked through."""
    own = getattr(out, "grad_fn", None)
    if own is None or int(out.shape[0]) < 4:
        return False
    for tensor in tensors if isinstance(tensors, (list, tuple)) else (tensors,):
        root = getattr(tensor, "grad_fn", None)
        for node in (post_order(root, _GATHER_NODES) if root is not None else None) or ():
            if type(node).__name__ not in _PAIRWISE or len(node.next_functions) != 2:
                continue
            sides = []
            for side, _ in node.next_functions:
                while side is not None and type(side).__name__ in _ROW_VIEWS:
                    side = side.next_functions[0][0]
                sides.append(side)
            if sides[0] is own and sides[1] is own:
                return True
    return False


def _gathered_targets(tensors, room: int) -> list[tuple]:
    """``(index, "gather", -100, None, logits' node)`` for each token pick of a hand-written
    log-likelihood in the graph of the loss: the tokens whose log-probabilities are summed. A
    pick is a gather along the last dimension of a ``log_softmax``'s output, of a softmax's log
    or of logits a ``logsumexp`` reads too (``logsumexp(z) - z.gather(...)``); integer indexing
    of every dimension of such log-probs or probabilities (``p[arange(B)[:, None],
    arange(T), y]``); a product of the log-probs with a one-hot (or smoothed) target
    distribution (``-(logp * F.one_hot(y, V)).sum(-1)``), read as its rows' top classes. The
    index is a saved value of the node, read without unpacking one saved under saved-tensor
    hooks (``graphpaths.saved``); CPU values only; a graph of more than ``_GATHER_NODES`` nodes
    is not looked through."""
    found: list[tuple] = []
    for tensor in tensors if isinstance(tensors, (list, tuple)) else (tensors,):
        root = getattr(tensor, "grad_fn", None)
        nodes = post_order(root, _GATHER_NODES) if root is not None else None
        if not nodes:
            continue
        # the nodes a logsumexp reads: logits whose gathered entries are log-probs up to it
        normalised = {id(n.next_functions[0][0]) for n in nodes
                      if type(n).__name__ == "LogsumexpBackward0" and n.next_functions
                      and n.next_functions[0][0] is not None}
        for node in nodes:
            if len(found) >= room:
                return found
            name = type(node).__name__
            if name == "GatherBackward0":
                picked = _gather_pick(node, normalised)
            elif name == "IndexBackward0":
                picked = _index_pick(node)
            elif name == "MulBackward0":
                picked = _one_hot_pick(node)
            else:
                continue
            if picked is not None:
                index, logits = picked
                found.append((index, _GATHERED, -100, None, logits))
    return found


def _log_probs_of(node, probabilities: bool = False):
    """The node of the logits under ``node`` when ``node`` makes log-probabilities of them
    (``log_softmax``, the log of a ``softmax``), or probabilities (a ``softmax``) when
    ``probabilities``; else None."""
    if node is None or not node.next_functions:
        return None
    name = type(node).__name__
    if name == "LogSoftmaxBackward0" or (probabilities and name == "SoftmaxBackward0"):
        return node.next_functions[0][0]
    if name == "LogBackward0":
        below = node.next_functions[0][0]
        if below is not None and type(below).__name__ == "SoftmaxBackward0" and below.next_functions:
            return below.next_functions[0][0]
    return None


def _gather_pick(node, normalised: set):
    if not node.next_functions:
        return None
    source = node.next_functions[0][0]
    if source is None:
        return None
    logits = _log_probs_of(source)
    if logits is None:
        if id(source) not in normalised:
            return None
        logits = source
    index, dim = saved(node, "_saved_index"), saved_dims(node)  # signed
    if not isinstance(index, torch.Tensor) or index.device.type != "cpu" \
            or index.dim() < 2 or not isinstance(dim, int) or dim not in (-1, index.dim() - 1):
        return None
    if index.shape[-1] == 1:
        index = index.squeeze(-1)
    return index, logits


def _index_pick(node):
    """``p[arange(B)[:, None], arange(T), y]`` over (B, T, V) log-probs or probabilities: ``y``
    broadcast to (B, T), when the first indices are the batch's and the positions' own."""
    if not node.next_functions:
        return None
    logits = _log_probs_of(node.next_functions[0][0], probabilities=True)
    sizes = saved(node, "_saved_self_sym_sizes")
    indices = saved(node, "_saved_indices")
    if logits is None or not isinstance(sizes, tuple) or len(sizes) != 3 \
            or not isinstance(indices, (tuple, list)) or len(indices) != 3:
        return None
    if not all(isinstance(i, torch.Tensor) and i.device.type == "cpu" and not i.is_floating_point()
               and i.dtype != torch.bool for i in indices):
        return None
    try:
        rows, positions, tokens = torch.broadcast_tensors(*indices)
    except RuntimeError:
        return None
    if rows.dim() != 2 or int(rows.shape[0]) != int(sizes[0]):
        return None
    B, L = (int(n) for n in rows.shape)
    with torch.no_grad():
        if not bool((rows == torch.arange(B)[:, None]).all()) \
                or not bool((positions == torch.arange(L)[None, :]).all()) or L != int(sizes[1]):
            return None
    return tokens, logits


def _one_hot_pick(node):
    """The top classes of the target distribution a (B, T, V) ``log_softmax`` output is
    multiplied by (saved, without a gradient)."""
    if len(node.next_functions) != 2:
        return None
    for mine, theirs in ((0, "_saved_other"), (1, "_saved_self")):
        logits = _log_probs_of(node.next_functions[mine][0])
        if logits is None or node.next_functions[1 - mine][0] is not None:
            continue
        target = saved(node, theirs)
        if not isinstance(target, torch.Tensor) or target.dim() != 3 or target.requires_grad \
                or target.numel() > _TARGET_VALUES:
            continue
        ids = _class_ids(target.float() if not target.is_floating_point() else target)
        if ids is None:
            continue
        return ids.reshape(target.shape[:-1]), logits
    return None


_UNREAD = object()  # the loss reads the model's positions through an op the walk cannot follow
_CHAIN = 64  # nodes walked at most from a loss's input down to the model's output
_RESHAPES = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "ExpandBackward",
             "UnsqueezeBackward", "SqueezeBackward", "FlattenBackward", "UnflattenBackward",
             "AsStridedBackward", "SplitBackward", "UnbindBackward", "ChunkBackward",
             "DiagonalBackward", "UnfoldBackward", "CatBackward", "StackBackward")


def _loss_positions(given, out):
    """Which of the model's output positions (dim 1 of ``out``) each position of the loss's
    input reads, when the loss's input is made from ``out`` through slices, ``narrow``s and
    integer indexing of the positions (``model(x)[:, P - 1:]``, ``[:, -K:]``, ``[:, ::2]``),
    transposes and ops that keep the layout (log_softmax, a temperature, a copy, a flattening
    view after them): the list of positions. None when the loss's input is not made from
    ``out`` (or ``given`` holds no graph): position ``j`` is read as ``j``. ``_UNREAD`` when
    the way down holds an op that moves the positions in a way not followed (a view before a
    slice, a select of one position, two ways that disagree)."""
    target = getattr(out, "grad_fn", None)
    if given is None or target is None:
        return None
    if given is target:
        return list(range(int(out.shape[1])))
    relevant = paths_to(given, lambda node: node is target, _NODES)
    if not relevant or given not in relevant:
        return None
    chains: list = []  # each way from the loss's input down to the model's output, node by node
    stack, visits = [(given, ())], 0
    while stack:
        node, way = stack.pop()
        visits += 1
        if node is target:
            chains.append(way)
            continue
        if len(way) >= _CHAIN or len(chains) > 4 or visits > 16 * _CHAIN:
            return _UNREAD
        for i in relevant.get(node, ()):
            stack.append((node.next_functions[i][0], way + (node,)))
    found = None
    for way in chains:
        positions = _read_positions(reversed(way), out)
        if positions is _UNREAD or (found is not None and positions != found):
            return _UNREAD
        found = positions
    return found if found is not None else _UNREAD


def _read_positions(way, out):
    """The positions of ``out`` (dim 1) the end of ``way`` (nodes from the model's output up)
    reads, or ``_UNREAD``."""
    B, dims = int(out.shape[0]), out.dim()
    positions = list(range(int(out.shape[1])))
    axis = 1  # where the positions lie; ``dims`` None once a view reshaped the tensor
    for node in way:
        name = node.name()
        if name.startswith("SliceBackward") or name.startswith("IndexBackward") \
                or name.startswith("SelectBackward"):
            sizes = saved(node, "_saved_self_sym_sizes")
            if dims is None or not isinstance(sizes, tuple) or len(sizes) != dims \
                    or int(sizes[0]) != B or int(sizes[axis]) != len(positions):
                return _UNREAD
            if name.startswith("IndexBackward"):
                indices = saved(node, "_saved_indices")
                if not isinstance(indices, (tuple, list)):
                    return _UNREAD
                picks = [(d, i) for d, i in enumerate(indices) if i is not None]
                if len(picks) != 1 or picks[0][0] != axis or not isinstance(picks[0][1], torch.Tensor) \
                        or picks[0][1].dim() != 1 or picks[0][1].is_floating_point() \
                        or picks[0][1].dtype == torch.bool:
                    return _UNREAD if any(d <= axis for d, _ in picks) else positions
                positions = [positions[int(i)] for i in picks[0][1].tolist()]
                continue
            dim = saved_dims(node)
            if not isinstance(dim, int):
                return _UNREAD
            dim %= dims
            if name.startswith("SelectBackward"):
                if dim <= axis:
                    return _UNREAD
                dims -= 1
                continue
            if dim == 0:
                return _UNREAD
            if dim == axis:
                start, end, step = (saved(node, n) for n in ("_saved_start", "_saved_end", "_saved_step"))
                if not all(isinstance(v, int) for v in (start, end, step)) or signed(step) < 1:
                    return _UNREAD
                positions = positions[signed(start):signed(end):signed(step)]
            continue
        if name.startswith("TransposeBackward") or name.startswith("PermuteBackward"):
            if dims is None:
                return _UNREAD
            if name.startswith("TransposeBackward"):
                pair = (saved_dims(node, "_saved_dim0"), saved_dims(node, "_saved_dim1"))
                if not all(isinstance(d, int) for d in pair):
                    return _UNREAD
                a, b = (d % dims for d in pair)
                order = list(range(dims))
                order[a], order[b] = order[b], order[a]
            else:
                order = saved_dims(node, "_saved_dims")
                if not isinstance(order, tuple) or len(order) != dims:
                    return _UNREAD
                order = [d % dims for d in order]
            if order[0] != 0:
                return _UNREAD
            axis = order.index(axis)
            continue
        if name.startswith(_RESHAPES):
            dims = None  # a slice after it is not read
    return positions


def _rows_kept(grad, r: int) -> bool:
    """Whether a (B, T, ...) gradient is non-zero in row ``r`` only: the output row probed read
    the ids of sample ``r`` alone, so dim 0 is the batch."""
    if not isinstance(grad, torch.Tensor) or grad.dim() < 2:
        return False
    with torch.no_grad():
        per = grad.detach().abs().reshape(grad.shape[0], -1).amax(1).float()
        top = float(per[r])
        if not top > 0.0:
            return False
        rest = torch.cat([per[:r], per[r + 1:]])
        return bool(rest.numel() == 0 or float(rest.max()) <= top * _TINY)


def _class_ids(target) -> torch.Tensor | None:
    """The class each row of a (N, C) CPU target distribution puts the most mass on, with
    all-zero rows (positions a hand-written label smoothing zeroes: padding) as ``_IGNORED``;
    None when it is no such distribution (negative values, a row without one top class, fewer
    than half its rows non-zero)."""
    if target.device.type != "cpu" or target.dim() < 2 or int(target.shape[-1]) < 3 \
            or target.numel() > _TARGET_VALUES:
        return None
    with torch.no_grad():
        rows = target.detach().reshape(-1, int(target.shape[-1])).float()
        if bool((rows < 0).any()):
            return None
        top2 = rows.topk(2, dim=1).values
        live = top2[:, 0] > 0
        if int(live.sum()) * 2 < rows.shape[0] or not bool((top2[live, 0] > top2[live, 1]).all()):
            return None
        ids = rows.argmax(1)
        ids[~live] = _IGNORED
    return ids


def _shift(ids, target, ignore: int, positions: list | None = None) -> int | None:
    """k in (1, 0, -1, 2) with ``target[:, j] == ids[:, p[j] + k]`` at >= 90 % of the positions
    the loss does not ignore, ``p[j]`` the model's output position the loss's position ``j``
    reads (``positions``; ``j`` itself when None) (2: targets shifted twice, once by the script
    and once by a loss that shifts them itself); None when none fits."""
    T, length = int(ids.shape[1]), int(target.shape[1])
    at = torch.tensor(positions if positions is not None else range(length), dtype=torch.long)
    best = None
    for k in (1, 0, -1, 2):
        inside = ((at + k) >= 0) & ((at + k) < T)
        if not bool(inside.any()):
            continue
        t = target[:, inside]
        i = ids[:, at[inside] + k]
        keep = t != ignore
        count = int(keep.sum())
        if count < _MIN_POSITIONS:
            continue
        share = float(((t == i) & keep).sum()) / count
        if share >= _MATCH and (best is None or share > best[1]):
            best = (k, share)
    return best[0] if best is not None else None


def _axis(grad, B: int) -> int | None:
    """Where a gradient carries the batch: dim 0 of a (B, ...) tensor whose dim 1 is not B too,
    dim 1 of a (T, B, ...) one (seq-first, an RNN's (layers, B, ...) state, a batch unsqueezed
    into a sequence of one) whose other dimensions are not B, unless it is a (B * T, D) one with
    D == B (a batch of sequences flattened for a Linear or a matmul: its samples lead, in
    blocks); None for any other layout, or when two dimensions could be the batch."""
    if not isinstance(grad, torch.Tensor) or grad.layout != torch.strided or grad.dim() == 0:
        return None
    first = int(grad.shape[0]) == B
    second = grad.dim() >= 2 and int(grad.shape[1]) == B
    if first and not second:
        return 0
    if second and not first and B not in grad.shape[2:] and (grad.dim() > 2 or int(grad.shape[0]) % B):
        return 1  # a weaker guess than dim 0: only when no other dimension is B either
    return None


def _clean(grad, B: int, r: int, axis: int | None = None) -> bool:
    """Only sample ``r`` of a gradient that carries the batch is non-zero (samples below
    ``_TINY`` of the largest count as zero); True for other layouts (nothing to tell). ``axis``:
    where the batch leads when the caller knows (dim 0 of rows in blocks of samples)."""
    axis = _axis(grad, B) if axis is None else axis
    if axis is None or not grad.numel():
        return True
    with torch.no_grad():
        g = grad.detach() if axis == 0 else grad.detach().transpose(0, 1)
        per = g.abs().reshape(B, -1).amax(1).float()
    top = float(per.max())
    if top == 0.0:
        return True
    others = torch.cat([per[:r], per[r + 1:]])
    return not bool((others > top * _TINY).any())


_VIEW_NODES = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")


def _blocks(grad_outputs, grad, B: int) -> bool:
    """Whether a view node's gradient goes from a (B, k, ...) output back to (B * k, ...) rows
    (k > 1): the view split the samples' merged rows, so its input holds them in blocks."""
    out = next((g for g in grad_outputs if isinstance(g, torch.Tensor)), None)
    if out is None or out.dim() < 2 or grad.dim() < 2 or int(out.shape[0]) != B:
        return False
    k = int(out.shape[1])
    return k > 1 and int(grad.shape[0]) == B * k and grad.numel() == out.numel()


def _kept(grad, B: int, r: int):
    """``grad`` with every sample but ``r`` zeroed (along its batch axis)."""
    axis = _axis(grad, B)
    kept = torch.zeros_like(grad)
    kept.select(axis, r).copy_(grad.select(axis, r))
    return kept


def _combine(a, b):
    """The state of a gradient summed from two: mixed (False) over excused (None) over clean."""
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


class _State:
    """What the node hooks of one probe saw: the nodes that pass on a gradient mixed across the
    batch while the one they got was not (in the engine's order: nearest the output first)."""

    def __init__(self, B: int, r: int):
        self.B, self.r = B, r
        # node -> the gradient it gets so far (from its parents): True clean, False mixed, None
        # excused (mixed by a product or gather on purpose where the batch axis was not seen)
        self.incoming: dict = {}
        self.introduced: list = []
        self.blind = False

    def _carries(self, grad) -> bool:
        return _axis(grad, self.B) is not None

    def hook(self, node, edges: tuple[int, ...]):
        kind = _kind(node.name())
        splits = node.name().startswith(_VIEW_NODES)
        children = node.next_functions
        state = self

        def hook(grad_inputs, grad_outputs):
            try:
                B, r = state.B, state.r
                known = [_clean(g, B, r) for g in grad_outputs if state._carries(g)]
                clean_in = all(known) if known else state.incoming.get(node, True)
                replaced = None
                for i in edges:
                    if i >= len(grad_inputs):
                        continue
                    g = grad_inputs[i]
                    if g is None:
                        continue
                    if splits and _blocks(grad_outputs, g, B):
                        # a view of (B * k, ...) rows as (B, k, ...): each sample's rows lead in
                        # a block of k (frames of clips merged for a per-frame encoder), whatever
                        # dim 1 of the rows holds (16 channels over a batch of 16)
                        clean = _clean(g, B, r, axis=0)
                        if not clean and clean_in is not False:
                            state.introduced.append(node)
                    elif state._carries(g):
                        clean = _clean(g, B, r)
                        if not clean and clean_in is not False:
                            # mixed here by an op that mixes on purpose, or by one in a layout
                            # where the batch axis was not seen (excused): cleaned, and the
                            # search goes on above
                            if kind is not None or clean_in is None:
                                if replaced is None:
                                    replaced = list(grad_inputs)
                                replaced[i] = _kept(g, B, r)
                                clean = True
                            else:
                                state.introduced.append(node)
                    elif kind == "stat" and clean_in is True:
                        state.blind = True  # batch statistics over another layout
                        clean = clean_in
                    elif kind == "mix" and clean_in is True:
                        clean = None  # a product or gather where the batch axis is not seen
                    else:
                        clean = clean_in
                    child = children[i][0]
                    if child is not None:
                        state.incoming[child] = _combine(state.incoming.get(child, True), clean)
                return tuple(replaced) if replaced is not None else None
            except Exception:
                state.blind = True  # a probe never breaks the backward
                return None

        return hook


def _walk(root, inputs) -> dict | None:
    """``{node: indices of its inputs that lead to a recorded tensor}`` over the graph
    below ``root``; None when it has more than ``_NODES`` nodes or a Python autograd.Function."""
    targets = {tensor.grad_fn for tensor in inputs if tensor.grad_fn is not None}
    return paths_to(root, targets.__contains__, _NODES, torch.autograd.function.BackwardCFunction)


def _traceback_location(rec: Recorder, node) -> Location | None:
    """The user's line that made ``node``, from anomaly mode's traceback (when the forward ran
    with it on)."""
    try:
        stack = node.metadata.get("traceback_")
    except Exception:
        return None
    if not stack:
        return None
    finder = rec.finder
    for entry in reversed(stack):
        match = _FRAME.search(entry)
        if match and finder.is_user_file(match.group(1)):
            return Location(finder.display_path(match.group(1)), int(match.group(2)), match.group(3))
    return None
