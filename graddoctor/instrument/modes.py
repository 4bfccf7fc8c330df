"""Train/eval modes: ``Module.train()``/``eval()`` calls and the forwards of BatchNorm and dropout.

What is watched, and how cheaply:

* ``Module.train`` (``eval()`` calls it): only the outermost call is recorded — ``train()``
  recurses into every child — as one ``train`` / ``eval`` event listing the BatchNorm/dropout modules
  it covers. Per-layer calls from one line (``for m in model.modules(): m.eval()``) are merged.
* BatchNorm (``_BatchNorm``, ``SyncBatchNorm``) and dropout forwards: their ``forward`` methods
  are patched on those classes. A global module forward pre-hook was measured first: it forces
  every module of every kind onto ``Module._call_impl``'s slow path (+26-31 % per forward on a
  small CNN and an 80-module MLP), while the patch costs nothing to other modules.
  Forwards are aggregated: one ``mode_forward`` event per user forward call line and
  (mode, grad mode, inference mode) while no other event happens in between, its ``modules``
  and ``calls`` growing until then; per-module facts (frozen, owned by an optimizer, updated by
  hand, track_running_stats, momentum, p) are a ``mode_module`` event made when they change.
  A no-grad forward made inside an outermost call that also ran grad-enabled ones is marked
  ``nested`` (MoCo's key encoder making the targets in the training forward). A dropout layer
  in train mode inside an eval-mode outermost module that does not register it (built in
  ``forward``, kept in a plain list) is a ``dropout_default`` aside event ("unregistered"):
  one attribute read per dropout forward in train mode, a walk of the model once per layer
  only when the model is in eval mode.
* Teachers: a dropout layer (p > 0) in train mode under no_grad is noted with the outermost
  model holding it whose parameters no optimizer trains (``mode_module``'s ``model``: a frozen
  distillation teacher, or an EMA / momentum copy), found once per outermost module called. Of
  each such model a few of its later forwards, once per optimizer step (per backward without
  an optimizer), look whether its parameters changed since the first (versions, storage and 64
  elements of up to 8 of them: ``p.data.mul_`` moves no version): changed is an EMA teacher
  (``model_changed``); unchanged over ``STATIC_AFTER`` steps, a static one
  (``model_unchanged``). Then it is not looked at again: one attribute read per dropout forward.
  A layer inside a reentrant checkpoint's no-grad forward (run again with gradients in the
  backward) is no teacher's: one walk of the stack per layer and outermost module.
* Freezes (``Tensor.requires_grad_(False)`` on a parameter, which ``Module.requires_grad_``
  calls): ``freeze`` events, so a finding can point at them. ``p.requires_grad = False`` is a
  C attribute and is not seen.
* Functional dropout driven by the mode (``F.dropout(x, p, self.training)``): instrument/dropout.py
  tells this watcher of a module whose own code ran it with the flag true in train mode (a
  holder, ``hold_functional``); ``eval()`` lists holders as it lists dropout layers, and a
  holder's forward in eval mode under grad mode (the flag false) is recorded as a dropout
  layer's (``functional_forward``; layer ``functional_dropout``), for train-in-eval-mode. Its
  train-mode forwards are not recorded. A model put in eval mode before its first forward has no
  holder known yet: not seen.
* Batches of one: at the first ``BATCH_TURNS`` backward turns, a BatchNorm layer in train mode
  (tracking running statistics, not frozen, not ``SyncBatchNorm``) given an input under grad
  mode in the script's thread has its input's first size read (shape metadata: no host sync on
  a device) and noted as a ``bn_batch`` aside, once per turn and size
  (batchnorm-batch-of-one). After those turns it costs one attribute test per BatchNorm forward.
* Recalibration signals: ``reset_running_stats()`` (``bn_reset``; not the call inside
  ``reset_parameters``), ``torch.optim.swa_utils.update_bn`` (an ``update_bn`` event; the
  forwards inside it are marked ``recalibrating``) and ``momentum=None`` (in ``mode_module``).

Events are final when emitted, so this watcher holds its events back (``_held``, in order, each
with the seq it will get) while any of them may still grow, as the recorder's ``holder``: the
recorder has it emit them (``close``) before any other event and at the end of the run. Nothing
else is emitted in between, so the seqs and the order are those of emitting each at once.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Mapping
from threading import get_ident

import torch
import torch.utils.checkpoint
from torch.nn.modules import batchnorm, dropout

from .. import events as ev
from ..location import site_key
from ..trace import Location
from .identities import Identities
from .inlinable import watched
from .names import variable_name
from .recorder import Recorder

BATCHNORM = (batchnorm._BatchNorm,)  # SyncBatchNorm and the lazy ones derive from it
DROPOUT = (dropout._DropoutNd,)
KINDS = BATCHNORM + DROPOUT
# ids of code objects: a membership test by the code object itself would hash each frame's code
_CALL_CODES = frozenset(map(id, (torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__)))
# a reentrant torch.utils.checkpoint runs its function under no_grad in this frame and again with
# gradients in the backward: its layers are part of what trains, whatever their own parameters
_REENTRANT = getattr(getattr(getattr(torch.utils.checkpoint, "CheckpointFunction", None), "forward", None),
                     "__code__", None)
# backward turns (backward calls before a forward) whose BatchNorm batch sizes are noted
BATCH_TURNS = 6
_RESET_CALLERS = frozenset(map(id, (batchnorm._NormBase.reset_parameters.__code__, batchnorm._NormBase.__init__.__code__)))


# a model holding dropout layers run in train mode under no_grad: over how many optimizer steps
# its parameters must stay unchanged to count as static (a frozen teacher, not an EMA copy), and
# how much of them is compared (see _Model)
STATIC_AFTER = ev.MODEL_STATIC_AFTER
_SAMPLED_TENSORS = 8
_SAMPLED_ELEMENTS = 64
_VERSIONED_TENSORS = 256


class _State:
    """What graddoctor knows about one BatchNorm/dropout module."""

    __slots__ = ("ref", "mid", "is_bn", "flags", "version", "updated", "trainable", "model", "model_root")

    def __init__(self, module, mid: int):
        self.ref = weakref.ref(module)
        self.mid = mid
        self.is_bn = isinstance(module, BATCHNORM)
        self.flags: tuple | None = None
        self.version: tuple | None = None
        self.updated = False  # params not owned by an optimizer changed in place (EMA, momentum encoder)
        self.trainable = False  # some parameter requires grad
        # a dropout layer run in train mode under no_grad: the _Model holding it (None: not
        # looked at, or no untrained model holds it) and the outermost module it was looked up in
        self.model: _Model | None = None
        self.model_root: int | None = None


class _Model:
    """A model holding dropout layers run in train mode under no_grad whose parameters no
    optimizer trains: a frozen teacher, or an EMA / momentum copy changed by hand. Its
    parameters are compared at a few of its later forwards, once per clock tick (optimizer
    steps; backward calls in a run without an optimizer), with what they were at the first."""

    __slots__ = ("ref", "name", "clock", "base", "unchanged", "changed", "done")

    def __init__(self, module, name: str, clock: int):
        self.ref = weakref.ref(module)
        self.name = name
        self.clock = clock
        self.base = self._snapshot(module)
        self.unchanged = 0  # clock ticks over which the parameters were seen unchanged
        self.changed = False
        self.done = False

    @staticmethod
    def _snapshot(module) -> tuple:
        """Versions and storage of the parameters (in place, ``p.data = ...``) and a few of
        their values (``p.data.mul_(...)`` moves no version)."""
        params = _plain_params(module)
        marks = tuple((p._version, p.data_ptr()) for p in params[:_VERSIONED_TENSORS])
        every = max(1, len(params) // _SAMPLED_TENSORS)
        with torch.no_grad():
            values = [p.detach().reshape(-1)[:_SAMPLED_ELEMENTS].clone()
                      for p in params[::every][:_SAMPLED_TENSORS]]
        return len(params), marks, values

    def look(self, clock: int) -> None:
        """One look at a later tick of the clock than the last one."""
        self.clock = clock
        module = self.ref()
        if module is None:
            self.done = True
            return
        count, marks, values = self._snapshot(module)
        base = self.base
        if count != base[0] or marks != base[1] or not all(map(torch.equal, values, base[2])):
            self.changed = self.done = True
            self.base = None
            return
        self.unchanged += 1
        if self.unchanged >= STATIC_AFTER:
            self.done = True
            self.base = None


def _plain_params(module) -> list:
    """The parameters whose values can be read here: plain tensors, neither lazy, meta nor a
    tensor subclass (a DTensor shard)."""
    return [p for p in module.parameters() if type(p) is torch.nn.Parameter and not p.is_meta]


class ModeWatcher:
    def __init__(self, rec: Recorder, owned: Mapping[int, None]):
        self.rec = rec
        self.owned = owned  # pids of the tensors some optimizer owns: OptimizerWatcher.owned_pids
        self._mid = Identities()  # module -> mid
        self._states: dict[int, _State] = {}
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        self._freeze_of: dict[int, tuple[weakref.ref, int]] = {}  # id(param) -> freeze event seq
        # our events not emitted yet, in order: [seq, kind, loc, data] (see the module docs)
        self._held: list[list] = []
        # the open mode_forward aggregates: key -> [data (held), mids seen, mids gradient flows
        # through]; closed by any other event, ours included (a mode_module event excepted)
        self._window: dict[tuple, list] = {}
        self._outer = self._outer_site = None  # the running outermost module call (see _call_site)
        # within that outermost call: [its frame, a grad-enabled forward ran in it, the data of
        # the no-grad forwards made in it] (``nested``: MoCo's key encoder inside the forward)
        self._mix: list = [None, False, []]
        # dropout layers in train mode called inside an eval-mode outermost module: id -> (weak
        # ref, registered in it); call lines already reported (see _unregistered)
        self._member: dict[int, tuple] = {}
        self._unregistered_done: set[tuple] = set()
        self._codes: dict[int, object] = {}  # the code objects whose ids are in keys (site_key)
        # outermost modules called with dropout in train mode under no_grad: id -> (weak ref,
        # {id(dropout layer): the _Model holding it, or None}); the _Models by id of their module
        self._model_roots: dict[int, tuple] = {}
        self._models: dict[int, _Model] = {}
        self._root: tuple | None = None  # (outermost call frame, its module), see _record_forward
        self._mode_depth = 0
        self._freezing = False
        self._recalibrating = False
        # (turn, size) noted as bn_batch events; None once the first BATCH_TURNS turns are over
        self._batch_seen: set[tuple[int, int]] | None = set()
        # modules whose own code runs dropout with their mode as the flag (``F.dropout(x, p,
        # self.training)``, seen in train mode by instrument/dropout.py): id -> (weak ref, p).
        # To eval() and the timeline they are dropout layers; their eval-mode forwards under
        # grad mode are recorded (functional_forward), not the others
        self.holders: dict[int, tuple] = {}

    # -- ids, places ---------------------------------------------------------------------
    def _user_frame(self, frame, skip_self=None):
        """The innermost user frame at or above ``frame``; frames of a user's own ``train``/``eval``
        override on ``skip_self`` are passed over, so the caller's ``model.train()`` is named."""
        for user in self.rec.finder.user_frames(frame):
            if not (skip_self is not None and user.f_code.co_name in ("train", "eval")
                    and user.f_locals.get("self") is skip_self):
                return user
        return None

    def _loc(self, frame) -> Location | None:
        return self.rec.finder.location(frame) if frame is not None else None

    # -- held events ---------------------------------------------------------------------------
    def _hold(self, made: ev.Made, loc) -> list:
        """Keep one of our events back, after the others held; returns its entry."""
        rec = self.rec
        rec.hold(self)
        held = self._held
        entry = [rec.trace.next_seq + len(held), made[0], loc, made[1]]
        held.append(entry)
        return entry

    def close(self) -> None:
        """Emit the held events as they are now, finished (the recorder calls this)."""
        held, self._held = self._held, []
        self._close_window()
        put = self.rec.put_held  # onto the steady path of a long run, else the trace
        wrong = [kind for seq, kind, loc, data in held if put((kind, data), loc).seq != seq]
        if wrong:  # an event went into the trace past Recorder.emit: a freeze seq may be off
            raise RuntimeError(f"held events emitted with other seqs than expected: {wrong}")

    def heads(self) -> list[tuple]:
        """The held events' kinds and locations, in order (the recorder's steady path)."""
        return [(kind, loc) for seq, kind, loc, data in self._held]

    def hold_aside(self, made: ev.Made, loc) -> None:
        """Keep an aside event (``Recorder.emit_aside``) after ours; the aggregates stay open."""
        self._hold(made, loc)

    def held(self) -> list[tuple]:
        """Copies of the held events as they are now (for a snapshot): (seq, kind, loc, data)."""
        return [(seq, kind, loc, {k: list(v) if type(v) is list else v for k, v in data.items()})
                for seq, kind, loc, data in list(self._held)]

    def _close_window(self) -> None:
        self._window.clear()
        self._outer = self._outer_site = None
        self._mix = [None, False, []]
        self._root = None

    def _merge_into_last(self, kind: str, loc, field: str | None, items, **match) -> list | None:
        """Merge a repeated call from the same line into our previous event when nothing else
        happened since (``for m in model.modules(): m.eval()`` -> one event); returns its held
        entry, or None."""
        if not self._held:
            return None  # emitted: something else happened since
        last = self._held[-1]
        if last[1] != kind or last[2] != loc:
            return None
        data = last[3]
        if any(data.get(k) != v for k, v in match.items()):
            return None
        if field is not None:
            have = data[field]
            for item in items:
                if item not in have:
                    have.append(item)
        data["calls"] += 1
        return last

    # -- train() / eval() ------------------------------------------------------------------
    def _wrap_train(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def train(module, mode=True, *args, **kwargs):
            if watcher._mode_depth or watcher._recalibrating:  # children, or update_bn's own calls
                return original(module, mode, *args, **kwargs)
            watcher._mode_depth += 1
            try:
                result = original(module, mode, *args, **kwargs)
            finally:
                watcher._mode_depth -= 1
            try:
                watcher._record_mode_set(module, mode, sys._getframe(1))
            except Exception as exc:
                rec.internal_error("Module.train", exc)
            return result

        return train

    def layer_ids(self, module) -> list[int]:
        """The mids of the BatchNorm and dropout layers under ``module``, numbered as this
        watcher's ``train``/``eval`` and ``mode_forward`` events number them (another
        watcher's event that names them: ``module.eval = True``)."""
        return [self._mid(m) for m in module.modules() if isinstance(m, KINDS)]

    def _record_mode_set(self, module, mode, frame) -> None:
        loc = self._loc(self._user_frame(frame, skip_self=module))
        mids = [self._mid(m) for m in module.modules() if isinstance(m, KINDS) or self._holds(m)]
        leaf = isinstance(module, KINDS)  # the call named one BatchNorm/dropout layer itself
        kind = "train" if mode else "eval"
        self._close_window()
        if leaf and self._merge_into_last(kind, loc, "modules", mids, leaf=True):
            return
        # every parameter under the call frozen: a pretrained part kept in eval mode on purpose
        flags = [p.requires_grad for p in module.parameters()]
        self._hold(ev.mode_set(mode=bool(mode), leaf=leaf, root=type(module).__name__,
                               frozen=bool(flags) and not any(flags), modules=mids, calls=1), loc)

    # -- forwards of BatchNorm / dropout (hot path: once per such module per forward) ------
    def _wrap_forward(self, original):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            # inside this thread's backward: checkpoint recomputation (another thread's backward
            # does not make this forward one)
            if not rec.running_backwards or not rec.in_backward():
                try:
                    watcher._record_forward(args[0], args[1] if len(args) > 1 else kwargs.get("input"))
                except Exception as exc:
                    rec.internal_error("BatchNorm/dropout forward", exc)

        return watched(original, before)

    # -- modules running functional dropout with their mode as the flag ---------------------
    def _holds(self, module) -> bool:
        entry = self.holders.get(id(module)) if self.holders else None
        return entry is not None and entry[0]() is module

    def hold_functional(self, module, p) -> None:
        """``module``'s code ran ``F.dropout(x, p, self.training)`` in train mode (called per
        such call: a lookup once it is known)."""
        entry = self.holders.get(id(module))
        if entry is None or entry[0]() is not module:
            self.holders[id(module)] = (weakref.ref(module), p)

    def functional_forward(self, module, input, frame) -> None:
        """A forward of a holder in eval mode under grad mode (``frame``: its method that ran
        the dropout), recorded as a dropout layer's forward."""
        if not self._holds(module) or (self.rec.running_backwards and self.rec.in_backward()):
            return
        self._record_forward(module, input, frame)

    def _call_site(self, start=None):
        """(outermost module call frame or None, the user's frame that made that call, its key).

        The walk to the top of the stack is done once per outermost call: while that call runs
        its frame stays on the stack, so a later layer's walk stops when it reaches it. The
        cached frames are dropped when the aggregation window closes (``_close_window``)."""
        if start is None:
            start = sys._getframe(4)  # _record_forward, before, the wrapper, then the module call
        f = start
        cached = self._outer
        if cached is not None:
            while f is not None and f is not cached:
                f = f.f_back
            if f is not None:
                return self._outer_site
            f = start
        outer = None
        codes = _CALL_CODES
        while f is not None:
            if id(f.f_code) in codes:
                outer = f
            f = f.f_back
        site = self._user_frame(outer.f_back if outer is not None else start)
        key = site_key(site, self._codes) if site is not None else None
        if outer is not None:
            self._outer, self._outer_site = outer, (outer, site, key)
        return outer, site, key

    def _record_forward(self, module, input, start=None) -> None:
        outer, site, site_key = self._call_site(start)
        grad = torch.is_grad_enabled()
        training = bool(module.training)
        # train mode under no_grad (a teacher making targets) or eval mode with gradients (a
        # frozen model a steering vector or an input is optimised through): the model holding
        # the dropout layer whose parameters no optimizer trains is looked up for either
        state = self._state(module, outer, site, training != grad)
        mid = state.mid
        key = (training, grad, site_key)
        # does the gradient flow through this module (is it part of what is being trained)?
        flows = grad and ((isinstance(input, torch.Tensor) and input.requires_grad) or state.trainable)
        if training and not state.is_bn and outer is not None:
            root = self._outer_self(outer)
            if root is not module and isinstance(root, torch.nn.Module) and not root.training:
                self._unregistered(module, root, site)
        if training and grad and state.is_bn and self._batch_seen is not None:
            self._note_batch(module, input, state, outer, site)
        entry = self._window.get(key)
        if entry is None:
            made = ev.mode_forward(training=training, grad=grad,
                                   inference=torch.is_inference_mode_enabled(), modules=[mid],
                                   grad_modules=[mid] if flows else [], calls=1,
                                   recalibrating=self._recalibrating)
            self._hold(made, self._loc(site))
            self._window[key] = entry = [made[1], {mid}, {mid} if flows else set()]
            data = entry[0]
        else:
            data, seen, flowing = entry
            if mid == data["modules"][0]:
                data["calls"] += 1
            elif mid not in seen:
                seen.add(mid)
                data["modules"].append(mid)
            if flows and mid not in flowing:
                flowing.add(mid)
                data["grad_modules"].append(mid)
        # a no-grad forward inside an outermost call that also ran grad-enabled ones: targets
        # made within the training forward (MoCo's key encoder), not a separate pass
        mix = self._mix
        if mix[0] is not outer:
            self._mix = mix = [outer, False, []]
        if outer is None:
            return
        if grad:
            if not mix[1]:
                mix[1] = True
                for other in mix[2]:
                    other["nested"] = True
        elif mix[1]:
            data["nested"] = True
        elif not any(d is data for d in mix[2]):
            mix[2].append(data)

    def _note_batch(self, module, input, state: _State, outer, site) -> None:
        """A ``bn_batch`` aside for the first size of a training BatchNorm input, once per turn
        and size, in the first ``BATCH_TURNS`` turns (see the module docs)."""
        turn = self.rec.progress.backward_calls
        if turn >= BATCH_TURNS:
            self._batch_seen = None
            return
        if isinstance(module, batchnorm.SyncBatchNorm) or not module.track_running_stats:
            return  # its batch spans the ranks / no running statistics to tell eval apart
        if state.flags is not None and state.flags[0] and not state.trainable:
            return  # frozen parameters in train mode: frozen-bn-train-mode's
        if not isinstance(input, torch.Tensor) or input.dim() < 2 or get_ident() != self.rec.script_thread:
            return  # DataParallel's replicas run in threads, each on a share of the batch
        size = int(input.shape[0])  # metadata: no host sync
        seen = self._batch_seen
        if (turn, size) in seen:
            return
        seen.add((turn, size))
        self.rec.emit_aside(ev.bn_batch(batch=size, shape=[int(n) for n in input.shape],
                                        layer=self._name(module, outer, site),
                                        cls=type(module).__name__, turn=turn), self._loc(site))

    def _outer_self(self, outer):
        """The module whose outermost call ``outer`` is (read once per outermost call)."""
        root = self._root
        if root is None or root[0] is not outer:
            root = self._root = (outer, outer.f_locals.get("self"))
        return root[1]

    def _unregistered(self, dropout, root, site) -> None:
        """A dropout layer in train mode inside a call of ``root``, which is in eval mode: when
        the layer is no submodule of ``root`` (``nn.Dropout(p)(x)`` built in ``forward``, a
        layer held in a plain list), ``root.eval()`` never reached it and it keeps dropping.
        A registered layer set back to train mode by hand is Monte Carlo dropout: silent."""
        known = self._member.get(id(dropout))
        if known is None or known[0]() is not dropout or known[1] != id(root):
            known = (weakref.ref(dropout), id(root), any(m is dropout for m in root.modules()))
            self._member[id(dropout)] = known
        if known[2] or not dropout.p > 0:
            return
        call = self._user_frame(sys._getframe(1))  # the line that called the dropout layer
        key = site_key(call, self._codes) if call is not None else None
        if key in self._unregistered_done:
            return
        self._unregistered_done.add(key)
        self.rec.emit_aside(ev.dropout_default(
            fn=f"nn.{type(dropout).__name__}", p=float(dropout.p), cls=type(root).__name__,
            name=variable_name(root, site) if site is not None else None,
            grad=torch.is_grad_enabled(), how="unregistered"), self._loc(call))

    def _state(self, module, outer, site, find_model: bool = False) -> _State:
        state = self._states.get(id(module))
        if state is None or state.ref() is not module:
            state = _State(module, self._mid(module))
            self._states[id(module)] = state
        if state.is_bn:
            params = module._parameters
            weight, bias = params.get("weight"), params.get("bias")
            if weight is not None:
                owned_pids, tensors = self.owned, self.rec.tensors  # rec.pid, inlined: every forward
                pid_of, refs = tensors.number, tensors.refs
                state.trainable = weight.requires_grad or (bias is not None and bias.requires_grad)
                owned = ((pid := pid_of.get(id(weight))) in owned_pids and refs[pid]() is weight) or (
                    bias is not None and (pid := pid_of.get(id(bias))) in owned_pids
                    and refs[pid]() is bias)
                if not owned or not state.trainable:
                    # changed by someone else than an optimizer (which skips a frozen parameter,
                    # it gets no gradient; MoCo hands its optimizer model.parameters() with the
                    # key encoder's in it): an EMA / momentum copy. In place bumps _version;
                    # MoCo's `p.data = ...` swaps the storage instead
                    version = (weight._version, weight.data_ptr())
                    if state.version is not None and version != state.version:
                        state.updated = True
                    state.version = version
            else:
                owned = None
            flags = (weight is not None, state.trainable, owned, state.updated,
                     module.track_running_stats, module.momentum)
        else:
            if find_model and outer is not None:
                root = self._root
                root = root[1] if root is not None and root[0] is outer else self._outer_self(outer)
                if state.model_root != id(root):
                    self._watch_model(module, state, root, site)
            model = state.model
            if model is None:
                flags = (module.p if isinstance(module, DROPOUT) else self.holders[id(module)][1],)
            else:
                if not model.done:
                    progress = self.rec.progress
                    clock = progress.steps if self.owned else progress.backward_calls
                    if clock > model.clock:
                        model.look(clock)
                flags = (module.p, model.name, model.unchanged, model.changed)
        if flags != state.flags:
            state.flags = flags
            self._emit_module(module, state, outer, site)
        return state

    # -- the models holding dropout layers run in train mode under no_grad (teachers) ---------
    def _watch_model(self, module, state: _State, root, site) -> None:
        """Note the model holding this dropout layer whose parameters no optimizer trains (see
        the module docs); once per layer and outermost module called (``root``). Not in a
        reentrant checkpoint's no-grad forward, which the backward runs again with gradients."""
        state.model_root = id(root)
        state.model = None
        if not isinstance(root, torch.nn.Module):
            return
        f = sys._getframe(1)
        while f is not None:  # the whole stack: the checkpoint may call the outermost module
            if f.f_code is _REENTRANT:
                return
            f = f.f_back
        entry = self._model_roots.get(id(root))
        if entry is None or entry[0]() is not root:
            entry = (weakref.ref(root), self._models_in(root, site))
            self._model_roots[id(root)] = entry
        state.model = entry[1].get(id(module))

    def _models_in(self, root, site) -> dict[int, _Model | None]:
        """For each dropout layer (p > 0) under ``root``: the outermost module on its path from
        ``root`` that holds parameters of which an optimizer trains none (owned and requiring
        grad), as a ``_Model``. One walk of ``root``, once per outermost module called."""
        owned, pid = self.owned, self.rec.pid
        prefix = variable_name(root, site) or type(root).__name__
        modules = dict(root.named_modules())
        untrained: dict[str, bool] = {}

        def is_untrained(path: str) -> bool:
            if path not in untrained:
                module = modules[path]
                untrained[path] = bool(_plain_params(module)) and not any(
                    p.requires_grad and pid(p) in owned for p in module.parameters())
            return untrained[path]

        found: dict[int, _Model | None] = {}
        progress = self.rec.progress
        clock = progress.steps if owned else progress.backward_calls
        for path, m in modules.items():
            if not isinstance(m, DROPOUT) or not m.p > 0:
                continue
            parts = path.split(".") if path else []
            holder = next((".".join(parts[:i]) for i in range(len(parts))
                           if is_untrained(".".join(parts[:i]))), None)
            if holder is None:
                found[id(m)] = None
                continue
            held = modules[holder]
            model = self._models.get(id(held))
            if model is None or model.ref() is not held:
                model = _Model(held, f"{prefix}.{holder}" if holder else prefix, clock)
                self._models[id(held)] = model
            found[id(m)] = model
        return found

    def _emit_module(self, module, state: _State, outer, site) -> None:
        model = None
        if state.is_bn:
            has_params, trainable, owned, updated, track, momentum = state.flags
            p = None
        else:
            p = state.flags[0]
            has_params, trainable, owned, updated, track, momentum = False, False, None, False, None, None
            model = state.model
        frozen = (not trainable) if has_params else None
        freeze = None
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            entry = self._freeze_of.get(id(weight))
            if entry is not None and entry[0]() is weight:
                freeze = entry[1]
        self._hold(ev.mode_module(
            mid=state.mid, name=self._name(module, outer, site), cls=type(module).__name__,
            layer="batchnorm" if state.is_bn else "dropout" if isinstance(module, DROPOUT) else "functional_dropout",
            has_params=has_params, frozen=frozen,
            owned=owned, trainable=trainable if has_params else None, updated=updated,
            track_running_stats=track, momentum=momentum, p=p, freeze=freeze,
            model=model.name if model is not None else None,
            model_unchanged=model.unchanged if model is not None else None,
            model_changed=model.changed if model is not None else False,
        ), None)  # a module fact does not close the window

    def _name(self, module, outer, site) -> str:
        """``model.backbone.1``: the user's variable for the outermost module of the call, then
        the path inside it. Once per module (names every BN/dropout of that model at once)."""
        entry = self._names.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        root = outer.f_locals.get("self") if outer is not None else None
        if isinstance(root, torch.nn.Module):
            prefix = variable_name(root, site) or type(root).__name__
            for path, m in root.named_modules():
                if (isinstance(m, KINDS) or self._holds(m)) and id(m) not in self._names:
                    self._names[id(m)] = (weakref.ref(m), f"{prefix}.{path}" if path else prefix)
            entry = self._names.get(id(module))
            if entry is not None and entry[0]() is module:
                return entry[1]
        return type(module).__name__

    # -- freezes ----------------------------------------------------------------------------
    def _wrap_requires_grad_(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def requires_grad_(tensor, *args, **kwargs):
            was_trainable = tensor.requires_grad
            result = original(tensor, *args, **kwargs)
            if isinstance(tensor, torch.nn.Parameter):
                try:
                    if not tensor.requires_grad:
                        # a second freeze of a frozen parameter changes nothing: the first froze it
                        if was_trainable or watcher.freeze_seq(tensor) is None:
                            watcher._record_freeze(tensor, sys._getframe(1))
                    elif watcher._freeze_of:  # unfrozen: its freeze no longer explains anything
                        watcher._freeze_of.pop(id(tensor), None)
                except Exception as exc:
                    rec.internal_error("requires_grad_", exc)
            return result

        return requires_grad_

    def _record_freeze(self, param, frame) -> None:
        loc = self._loc(self._user_frame(frame))
        self._close_window()
        entry = self._merge_into_last("freeze", loc, None, ())
        if entry is None:
            entry = self._hold(ev.freeze(calls=1), loc)  # calls: parameters frozen from this line
        self._freeze_of[id(param)] = (weakref.ref(param), entry[0])

    def freeze_seq(self, param) -> int | None:
        """The seq of the ``freeze`` event of the user's latest ``requires_grad_(False)`` on this
        parameter (None: never seen, or unfrozen since with ``requires_grad_(True)``)."""
        entry = self._freeze_of.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else None

    # -- recalibration signals -----------------------------------------------------------------
    def _wrap_reset_running_stats(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def reset_running_stats(module, *args, **kwargs):
            result = original(module, *args, **kwargs)
            caller = id(sys._getframe(1).f_code)
            if not watcher._recalibrating and caller not in _RESET_CALLERS and isinstance(module, BATCHNORM):
                try:
                    loc = watcher._loc(watcher._user_frame(sys._getframe(1)))
                    mids = [watcher._mid(module)]
                    watcher._close_window()
                    if watcher._merge_into_last("bn_reset", loc, "modules", mids) is None:
                        watcher._hold(ev.bn_reset(modules=mids, calls=1), loc)
                except Exception as exc:
                    rec.internal_error("reset_running_stats", exc)
            return result

        return reset_running_stats

    def _wrap_update_bn(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def update_bn(*args, **kwargs):
            if watcher._recalibrating:
                return original(*args, **kwargs)
            watcher._close_window()
            watcher._hold(ev.update_bn(), rec.here(2))
            watcher._recalibrating = True
            try:
                return original(*args, **kwargs)
            finally:
                watcher._recalibrating = False
                watcher._close_window()

        return update_bn

    def install(self, patcher) -> None:
        Module = torch.nn.Module
        patcher.patch(Module, "train", self._wrap_train(Module.train))
        patched = [batchnorm._BatchNorm, batchnorm.SyncBatchNorm]
        patched += [cls for cls in vars(dropout).values()
                    if isinstance(cls, type) and issubclass(cls, dropout._DropoutNd) and "forward" in vars(cls)]
        for cls in patched:
            patcher.patch(cls, "forward", self._wrap_forward(cls.forward))
        patcher.patch(torch.Tensor, "requires_grad_", self._wrap_requires_grad_(torch.Tensor.requires_grad_))
        NormBase = batchnorm._NormBase
        patcher.patch(NormBase, "reset_running_stats", self._wrap_reset_running_stats(NormBase.reset_running_stats))
        swa_utils = torch.optim.swa_utils
        patcher.patch(swa_utils, "update_bn", self._wrap_update_bn(swa_utils.update_bn))
