"""Optimizers: which parameters each owns, their steps, and every zero_grad.

Steps use PyTorch's global step hooks (``Optimizer.step`` is re-wrapped per class, so patching
it is fragile). ``zero_grad`` has no hook: the base ``Optimizer`` and ``Module`` methods are
patched, with a re-entrancy guard so an override that calls ``super()`` is recorded once.
A hyper-parameter set as an attribute (``optimizer.lr = 1e-4``, which torch's step never reads)
is seen through a class-level ``__setattr__`` on ``Optimizer`` that sets the attribute first.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
import weakref
from threading import get_ident
from itertools import compress, repeat
from operator import and_, attrgetter, is_, is_not, itemgetter, ne, not_
from types import MappingProxyType

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from .. import events as ev
from ..location import same_chain
from . import fold
from .divergence import Divergence
from .editfactor import EditFactors
from .gradstate import Tensor, grads_of, local, tensors_of, version
from .identities import call
from .recorder import SAME_LIST_MIN, Recorder
from .topics import (FREEZE_OF, GRADS_UNSCALED, PARAMS_ADDED, STEP_BEGINS, STEP_GRADS, STEP_NORMS, STEPPED,
                     STEPPED_WITHOUT_GRAD)

_requires_grad = attrgetter("requires_grad")
_version = attrgetter("_version")
_is_sparse = attrgetter("is_sparse")
_device = attrgetter("device")
_is_cpu = attrgetter("is_cpu")
_item = torch.Tensor.item
_ALIAS_OPTIMIZERS = 8  # the latest optimizers whose parameters' memory is kept (ints only)
_grad_enabled = torch.is_grad_enabled


class StepGrads:
    """What ``step_grads`` read of the gradients an optimizer is about to apply.

    ``pids``/``grads``: those with a ``.grad`` (the dense, plain-tensor fast path: one device
    group, built lazily by ``by_device``), ``states`` their ``(id, version)``, ``without`` the
    owned pids with none; ``vouched``: every one is vouched finite. Held from the step's pre
    hook to its post hook only (``GradState.after_step`` takes the states from it when the step
    left the grads as they were, instead of reading them again)."""

    __slots__ = ("pids", "grads", "states", "versions", "without", "vouched", "owned",
                 "known", "_by_device", "param_versions", "has", "_sparse")

    def __init__(self, pids, grads, states, without, vouched, by_device=None, versions=None,
                 owned=None, known: bool = False, param_versions=None, has=None):
        self.pids, self.grads, self.states, self.without = pids, grads, states, without
        self.vouched = vouched
        self._by_device = by_device
        self.versions = versions  # each grad's ``_version`` (the second item of its state)
        # (pids, tensors, their grads) of every owned parameter, None in the grads for those
        # without one: what the post hook compares with (None when some had died)
        self.owned = owned
        self.known = known  # the states are what graddoctor knew already (nothing to note)
        # each owned parameter's own ``_version`` before the step (parallel to ``owned``; None
        # when not read) and which of them had a grad (None: every one): what
        # ``GradState.after_step`` predicts the versions after the step from
        self.param_versions = param_versions
        self.has = has
        self._sparse = False  # by_device left sparse grads out

    def untouched(self) -> bool:
        """Whether every grad is still at the version read before the step (a pass over them)."""
        return self.versions is not None and list(map(_version, self.grads)) == self.versions

    def by_device(self) -> dict:
        """``device -> ([pid], [grad])``, dense grads only; checked for sparse grads and
        several devices only here, when a norm pass or a picture needs the groups."""
        if self._by_device is None:
            grads = self.grads
            if not grads:
                self._by_device = {}
            elif any(map(_is_sparse, grads)) or len(set(map(_device, grads))) != 1:
                self._by_device = _group(self.pids, grads)
                self._sparse = any(map(_is_sparse, grads))
            else:
                self._by_device = {grads[0].device: (self.pids, grads)}
        return self._by_device

    def sparse_norms(self) -> tuple[list[int], list[float]]:
        """``(pids, norms)`` of the sparse grads ``by_device`` left out (an ``nn.Embedding(...,
        sparse=True)``'s), each the norm of its coalesced values (one host read in all); empty
        lists when there are none."""
        if self._by_device is None:
            self.by_device()
        if not self._sparse:
            return [], []
        pids = [pid for pid, grad in zip(self.pids, self.grads) if grad.is_sparse]
        with torch.no_grad():
            values = [grad.coalesce()._values().detach().float().norm().cpu()
                      for grad in self.grads if grad.is_sparse]
            return pids, torch.stack(values).tolist() if values else []


def _group(pids, grads) -> dict:
    """``device -> ([pid], [grad])`` of the dense grads among ``grads`` (parallel to ``pids``)."""
    by_device: dict = {}
    for pid, grad in zip(pids, grads):
        if not grad.is_sparse:
            pids_grads = by_device.get(grad.device)
            if pids_grads is None:
                pids_grads = by_device[grad.device] = ([], [])
            pids_grads[0].append(pid)
            pids_grads[1].append(grad)
    return by_device


def _several_ranks() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def step_grads(rec: Recorder, pids, edited: list | None = None,
               trust_scaler: bool = False, frozen: list | None = None,
               by_hand: list | None = None) -> StepGrads:
    """One pass over the gradients an optimizer is about to apply (hot path: every update).

    Returns them (``StepGrads``: grouped by device on demand) and whether every one is vouched
    finite (``Recorder.finite``; ``trust_scaler``: this step runs inside GradScaler.step, so
    unscale_'s vouchers hold). With ``edited`` (a list), the same pass also collects the pids
    whose ``.grad`` was changed in place by code graddoctor does not watch (``p.grad /= k``):
    the grad tensor's ``(id, _version)`` is neither what graddoctor last saw nor what zero_grad
    left. With ``frozen`` (a list), it also collects the pids that have a ``.grad`` while
    ``requires_grad`` is False: frozen, yet the step updates them (torch's optimizers skip a
    parameter only when its ``.grad`` is None). With ``by_hand`` (a list), it also collects the
    pids with a ``.grad`` whose tensor was changed in place since the latest step that owns
    them (its ``_version`` differs from ``Recorder.param_version``): edited by code other than
    the optimizer, e.g. an EMA update (``p.data`` edits do not count: they bypass the version
    counter). It notes every owned parameter's ``requires_grad`` (``GradState.requires_grad``).

    Written as ``map``s that run in C (no Python per gradient), each check a comparison of
    whole lists first (the common case: nothing to collect); the general path
    (``_step_grads_each``) takes DTensors."""
    pids = pids if type(pids) is list else list(pids)
    gradstate = rec.grads
    owned_pids = pids
    tensors = list(map(call, gradstate.refs_of(pids)))  # tensors_of, its lookups kept per list
    died = not all(map(is_not, tensors, repeat(None)))
    if died:  # the rest as they are
        alive = list(map(is_not, tensors, repeat(None)))
        pids, tensors = list(compress(pids, alive)), list(compress(tensors, alive))
    requires = list(map(_requires_grad, tensors))
    gradstate.note_requires_grad(pids, requires)
    every_requires = all(requires)
    grads = grads_of(tensors)
    owned = None if died else (pids, tensors, grads)
    # every owned parameter's version before the step (what the post hook predicts from)
    param_versions = list(map(_version, tensors)) if by_hand is not None else None
    has = list(map(is_not, grads, repeat(None)))
    every_has = all(has)
    without: list = []
    if not every_has:
        without = list(compress(pids, map(not_, has)))
        pids, grads = list(compress(pids, has)), list(compress(grads, has))
        if not every_requires:
            requires = list(compress(requires, has))
    if not grads:
        return StepGrads([], [], [], without, True, {}, versions=[], owned=owned)
    if not all(map(is_, map(type, grads), repeat(Tensor))):
        by_device, vouched = _step_grads_each(rec, pids, edited, trust_scaler, frozen, by_hand)
        return StepGrads(pids, grads, None, without, vouched, by_device)
    if frozen is not None and not every_requires and not all(requires):
        frozen.extend(compress(pids, map(not_, requires)))
    if by_hand is not None:
        # the versions the latest step left, as one predicted list when the ledger has them so
        after = None if died else gradstate.versions_after_step(owned_pids)
        if after is not None and len(after) == len(param_versions):
            if after != param_versions:
                changed = map(ne, after, param_versions)
                by_hand.extend(compress(owned_pids, changed if every_has
                                        else map(and_, has, changed)))
        else:
            now = param_versions if every_has else list(compress(param_versions, has))
            last = list(map(gradstate.param_version.get, pids, now))
            if now != last:
                by_hand.extend(compress(pids, map(ne, last, now)))
    versions = list(map(_version, grads))
    states = list(zip(map(id, grads), versions))
    known_already = False
    if edited is not None:
        known = list(map(rec.grads.known.get, pids))
        known_already = known == states
        if not known_already:
            zeroed = rec.grads.zeroed
            edited.extend(compress(pids, map(and_, map(ne, states, known),
                                             map(ne, states, map(zeroed.get, pids)))))
    finite = gradstate.finite
    vouched = False
    if finite:
        # the latest voucher's own lists (a clip's, unscale_'s) first: two list comparisons
        conditional = gradstate.vouched_exactly(pids, states)
        if conditional is not None:
            vouched = trust_scaler or not conditional
        else:
            entries = list(map(finite.get, pids))
            vouched = (None not in entries and list(map(itemgetter(0), entries)) == states
                       and (trust_scaler or not any(map(itemgetter(1), entries))))
    return StepGrads(pids, grads, states, without, vouched, versions=versions, owned=owned,
                     known=known_already, param_versions=None if died else param_versions,
                     has=None if every_has else has)


def _step_grads_each(rec: Recorder, pids, edited: list | None = None,
                     trust_scaler: bool = False, frozen: list | None = None,
                     by_hand: list | None = None) -> tuple[dict, bool]:
    """``step_grads`` one tensor at a time, for grads that are not plain tensors (a DTensor:
    its state is the wrapper's, its norm its local shard's)."""
    seen_pids: list = []
    seen_grads: list = []
    refs = rec.tensors.refs
    known, zeroed, finite = rec.grads.known, rec.grads.zeroed, rec.grads.finite
    versions = rec.grads.param_version if by_hand is not None else None
    all_vouched = True
    for pid in pids:
        tensor = refs[pid]()
        grad = tensor.grad if tensor is not None else None
        if grad is None:
            continue
        if frozen is not None and not tensor.requires_grad:
            frozen.append(pid)
        if versions is not None and versions.get(pid, tensor._version) != tensor._version:
            by_hand.append(pid)
        if type(grad) is not Tensor:  # a DTensor (FSDP2): its local shard, no communication
            state = (id(grad), version(grad))
            grad = local(grad)
        else:
            state = (id(grad), grad._version)
        if edited is not None and state != known.get(pid) and state != zeroed.get(pid):
            edited.append(pid)
        if all_vouched:
            vouched = finite.get(pid)
            all_vouched = (vouched is not None and vouched[0] == state
                           and (trust_scaler or not vouched[1]))
        seen_pids.append(pid)
        seen_grads.append(grad)
    return _group(seen_pids, seen_grads), all_vouched


def norms_by_device(by_device: dict) -> tuple[list[int], list[float]]:
    """The L2 norm of each gradient in one batched ``torch._foreach_norm`` per device and one
    host read per device (never a sync per parameter)."""
    if len(by_device) == 1:  # hot path: every update of a loop that neither clips nor unscales
        (device, (device_pids, grads)), = by_device.items()
        if device.type == "cpu" and not (_grad_enabled() and any(map(_requires_grad, grads))):
            # on the CPU each norm is read as it is (no device to wait for): the same floats as
            # stack + tolist, without their two calls; no graph to keep out of without no_grad
            return list(device_pids), list(map(_item, torch._foreach_norm(grads)))
    out_pids: list[int] = []
    out_norms: list[float] = []
    with torch.no_grad():
        for device_pids, grads in by_device.values():
            norms = torch._foreach_norm(grads)
            out_pids.extend(device_pids)
            # stack promotes mixed dtypes; one device-to-host read per device
            out_norms.extend(torch.stack(norms).tolist())
    return out_pids, out_norms


def grad_norms(rec: Recorder, pids, edited: list | None = None) -> tuple[list[int], list[float]]:
    """The per-update numeric summary: ``(pids, norms)`` of every dense gradient in ``pids``."""
    return norms_by_device(step_grads(rec, pids, edited).by_device())


def _really_nonfinite(rec: Recorder, pid: int) -> bool:
    """A norm overflows to inf for huge but finite grads (fp32 elements above ~1.8e19): confirm
    on the gradient itself. Only runs for grads whose norm is not finite, so it costs nothing on
    a healthy run."""
    tensor = rec.tensor(pid)
    grad = tensor.grad if tensor is not None else None
    if grad is None:
        return False
    with torch.no_grad():
        grad = local(grad)
        if grad.is_sparse:  # an embedding's sparse grad: its values (isfinite has no sparse kernel)
            grad = grad.coalesce()._values()
        return not bool(torch.isfinite(grad).all())


# What moves a parameter whose gradient is zero, per optimizer class (besides weight decay): a
# momentum buffer (SGD, RMSprop with momentum), Adam's first moment; None: nothing (the update is
# proportional to the gradient: Adagrad, Adadelta, Rprop). Subclasses count as their base.
_ZERO_GRAD_MOVERS = [
    ("SGD", "momentum_buffer", "momentum"), ("RMSprop", "momentum_buffer", "momentum"),
    ("Adam", "exp_avg", "moments"), ("AdamW", "exp_avg", "moments"),
    ("Adamax", "exp_avg", "moments"), ("NAdam", "exp_avg", "moments"),
    ("RAdam", "exp_avg", "moments"), ("Adagrad", None, None), ("Adadelta", None, None),
    ("Rprop", None, None), ("ASGD", None, None),
]


def _number(value) -> float | None:
    """A hyper-parameter as a float; None when reading it would cost a host sync (a device
    tensor) or it is not a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 1:
        return float(value)
    return None


def zero_grad_mover(optimizer, group: dict, state) -> str | None:
    """What makes ``optimizer`` change a parameter of ``group`` (its state ``state``) whose
    gradient is zero: "weight_decay", "momentum", "moments", "unknown" (a class graddoctor does
    not know), or None (nothing: ``p -= lr * 0``). Reads the hyper-parameters as they are now,
    before the step; a value on a device counts as non-zero (no host sync)."""
    if _number(group.get("lr")) == 0:
        return None
    decays = [group.get("weight_decay", 0)]
    if isinstance(optimizer, torch.optim.ASGD):
        decays.append(group.get("lambd", 0))  # ASGD shrinks every parameter by (1 - lambd * eta)
    if any(decay is not None and _number(decay) != 0 for decay in decays):
        return "weight_decay"
    for name, key, mover in _ZERO_GRAD_MOVERS:
        cls = getattr(torch.optim, name, None)
        if cls is not None and isinstance(optimizer, cls):
            if key is None or not state or state.get(key) is None:
                return None  # no buffer yet: it would start from this zero gradient
            if mover == "momentum" and _number(group.get("momentum", 0)) == 0:
                return None
            return mover
    return "unknown"


# attribute names that stand for a param_groups key of another name
_KEY_ALIASES = {"learning_rate": "lr"}


def _steps_with_param_groups(optimizer, name: str) -> bool:
    """Whether ``optimizer``'s step is torch's own (so it reads ``param_groups``, never an
    attribute) and its class gives ``name`` no meaning of its own (a property that writes the
    groups). A class from the user or another library may read ``self.lr``: not judged."""
    cls = type(optimizer)
    step_module = getattr(getattr(cls, "step", None), "__module__", None) or ""
    return step_module.startswith("torch.") and not hasattr(cls, name)


MOVE_CHECKS = 8  # optimizer steps an unowned tensor with a gradient is watched for moving
MOVE_SAMPLE = 1024  # elements of it compared (strided over the whole tensor)


def _sample(tensor):
    """A strided copy of at most ``MOVE_SAMPLE`` of the tensor's values: a copy-back of stepped
    values (an fp32 master's) changes nearly every element, so a sample tells it cheaply."""
    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // MOVE_SAMPLE)
        return flat[::stride][:MOVE_SAMPLE].clone()


class MoveWatch:
    """Tracked tensors that get a gradient but that no optimizer owns: do their values change
    between optimizer steps (mixed precision by hand copies the stepped fp32 master values back
    into the model; a tensor updated by hand under no_grad)? Such tensors train although no
    optimizer owns them. Checked at each optimizer step, from the first step after a tensor's
    first gradient, for at most ``MOVE_CHECKS`` steps or until it moves: its ``_version`` first
    (for a tensor larger than the sample), then a strided sample of its values (``p.data.copy_``
    bypasses the version; a clamp_ within range bumps it and changes nothing), compared in
    one batched op and one host read per device. A run whose optimizers own every tensor that
    gets a gradient pays one length comparison per step."""

    def __init__(self, rec: Recorder, owned: dict):
        self.rec = rec
        self.owned = owned
        self.watched: dict[int, object] = {}  # pid -> None (no grad yet) | (version, sample, left)
        self.done: set[int] = set()  # moved, or watched long enough
        self.known = 0  # tracked tensors looked at so far

    def moved(self) -> list[int]:
        rec = self.rec
        refs = rec.tensors.refs
        if len(refs) != self.known:
            owned, done, watched = self.owned, self.done, self.watched
            for pid in range(self.known, len(refs)):
                if pid not in owned and pid not in done:
                    watched.setdefault(pid, None)
            self.known = len(refs)
        if not self.watched:
            return []
        moved: list[int] = []
        compare: dict = {}  # device -> ([pid], [before], [now])
        for pid, state in list(self.watched.items()):
            tensor = refs[pid]()
            if tensor is None or pid in self.owned:
                del self.watched[pid]
                continue
            try:
                if state is None:
                    if tensor.grad is not None:
                        self.watched[pid] = (tensor._version, _sample(tensor), MOVE_CHECKS)
                    continue
                version_before, before, left = state
                if tensor._version != version_before and tensor.numel() > MOVE_SAMPLE:
                    moved.append(pid)
                    continue
                # a tensor the sample covers whole is judged by its values: an in-place op that
                # left them as they were (a clamp_ within range) bumps the version, moves nothing
                now = _sample(tensor)
            except Exception:  # a tensor we cannot sample (sparse, a subclass): not judged
                del self.watched[pid]
                self.done.add(pid)
                continue
            entry = compare.setdefault(now.device, ([], [], []))
            entry[0].append(pid)
            entry[1].append(before)
            entry[2].append(now)
        with torch.no_grad():
            for pids, befores, nows in compare.values():
                changed = torch.stack([torch.ne(b, n).any() for b, n in zip(befores, nows)]).tolist()
                for pid, change, now in zip(pids, changed, nows):
                    if change:
                        moved.append(pid)
                        continue
                    version_before, _before, left = self.watched[pid]
                    if left <= 1:
                        del self.watched[pid]
                        self.done.add(pid)
                    else:
                        self.watched[pid] = (version_before, now, left - 1)
        for pid in moved:
            self.watched.pop(pid, None)
            self.done.add(pid)
        return moved
def plain_number(value):
    """A float or int (not a bool, not a tensor: reading a device tensor would synchronise)."""
    if type(value) is float or type(value) is int:
        return value
    return None


_HYPER = ("betas", "momentum", "dampening", "weight_decay", "eps", "alpha")


def group_hyper(group) -> dict | None:
    """A param group's update-rule settings that are plain numbers (``betas`` a pair of them),
    read once, at the optimizer's construction (optimizer_init's ``hyper``)."""
    if type(group) is not dict:
        return None
    out = {}
    for key in _HYPER:
        value = group.get(key)
        if key == "betas":
            if type(value) in (tuple, list) and len(value) == 2:
                pair = [plain_number(v) for v in value]
                if None not in pair:
                    out[key] = pair
        elif (number := plain_number(value)) is not None:
            out[key] = number
    return out


def group_lrs(optimizer) -> list | None:
    """Each param group's lr as a plain number (None for a tensor lr), or None."""
    groups = getattr(optimizer, "param_groups", None)
    if type(groups) is not list:
        return None
    # plain_number written out: every step of a long run reads them
    return [(lr if type(lr := g.get("lr")) is float or type(lr) is int else None)
            if type(g) is dict else None for g in groups]


_SETTINGS_OF_OTHERS = ("params", "param_names")  # keys torch itself reads besides the defaults


def unread_keys(optimizer, group) -> list | None:
    """The keys of a param group given to one of torch's optimizers that its step never reads
    (not a default of this optimizer, not ``params``), each with its value when that is a plain
    number: ``{"params": ..., "LR": 1e-2}`` keeps stepping with the default lr. Read once, at
    construction, before any scheduler adds its own keys; None when there are none."""
    if type(group) is not dict or not _torch_step_class(type(optimizer)):
        return None
    defaults = getattr(optimizer, "defaults", None)
    if not isinstance(defaults, dict):  # the attribute watcher's dict subclass included
        return None
    extra = [[key, plain_number(value)] for key, value in group.items()
             if type(key) is str and key not in defaults and key not in _SETTINGS_OF_OTHERS]
    return extra or None


# optimizer class -> whether its step is one of torch's; weak: an optimizer class the script
# defined holds the script's namespace, which a finished check lets go of
_STEP_CLASSES: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()


def _torch_step_class(cls) -> bool:
    known = _STEP_CLASSES.get(cls)
    if known is None:
        known = _STEP_CLASSES[cls] = (getattr(getattr(cls, "step", None), "__module__", None)
                                      or "").startswith("torch.optim.")
    return known


# steps of a torch optimizer that must leave its grads' versions unchanged before its later
# steps are trusted to (``OptimizerWatcher._untouched``)
TRUSTED_AFTER = 3


def _torch_step(optimizer) -> bool:
    """Whether ``optimizer.step`` is one of torch's own (they never set a ``.grad``); an
    LR scheduler's wrapper around it (set on the instance) keeps the wrapped one's module."""
    own = vars(optimizer).get("step")
    return _torch_step_class(type(optimizer)) and (
        own is None or (getattr(own, "__module__", None) or "").startswith("torch.optim."))


def _has_closure(args, kwargs) -> bool:
    # the step hooks get the step's own args, ``self`` first
    return (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None


class OptimizerWatcher:
    def __init__(self, rec: Recorder, scalers):
        self.rec = rec
        self.scalers = scalers  # the GradScaler watcher: ``in_scaler_step``
        self.closure_step: int | None = None  # optimizer id while optimizer.step(closure) runs
        self._owned: dict[int, None] = {}  # pids of every tensor an optimizer owns (a set)
        # opt -> {(device, data_ptr): pid} of the parameters it was given, and the pids listed
        # (read at construction only: two entries over one memory are stepped twice)
        self._starts: dict[int, dict[tuple, int]] = {}
        self._listed: dict[int, set[int]] = {}
        self._moves = MoveWatch(rec, self._owned)
        self._divergence = Divergence(rec)  # growth of each optimizer's gradient norm
        self._clearing = False
        self._step_frames: list = []  # frames of the optimizer steps running now, outermost first
        self._read: tuple | None = None  # (opt, StepGrads) of the outermost step running
        # opt -> its steps so far that left every grad's version unchanged; -1 once one did not
        self._untouched_steps: dict[int, int] = {}
        # (step wrapper frame, optimizer, opt, location) of the outermost step running: its post
        # hook, called from the same frame, has the same caller and so the same location
        self._began: tuple | None = None
        self._backwards_before = 0  # rec.progress.backward_calls when the outermost step began
        # the backward watcher's samples of the first grads it wrote, read at an edited step
        self.edit_factors = EditFactors()
        self._stepped = rec.subscribers(STEPPED)
        self._stepped_without_grad = rec.subscribers(STEPPED_WITHOUT_GRAD)
        self._step_grads = rec.subscribers(STEP_GRADS)  # only when a picture is asked for
        self._step_norms = rec.subscribers(STEP_NORMS)
        self._step_begins = rec.subscribers(STEP_BEGINS)
        self._params_added = rec.subscribers(PARAMS_ADDED)
        self._freeze_of = rec.subscribers(FREEZE_OF)
        rec.subscribe(GRADS_UNSCALED, self._unscaled)
        self._normed: set[int] = set()  # optimizers whose first update carried norms
        # the straight-line hooks' armed reads (see _arm_clear): None when not armed
        self._armed_clear: tuple | None = None
        self._armed_begin: tuple | None = None
        self._armed_step: tuple | None = None
        # (pids, norms) of the latest step measured on the straight-line path: what a skimmed
        # step's event carries (Folder.skimming)
        self._sampled_norms: tuple | None = None
        self._attrs_seen: set[tuple] = set()  # (path, line, opt, name) of attributes recorded
        # watch(): an optimizer never registered (made before the block) is registered when
        # first stepped or zero_grad'ed (a script's optimizers are all made under graddoctor)
        self.adopt_unknown = False

    # -- construction --------------------------------------------------------------------
    def _wrap_add_param_group(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def add_param_group(optimizer, param_group):
            result = original(optimizer, param_group)
            try:
                watcher._register(optimizer, optimizer.param_groups[-1:],
                                  watcher._construction_site(optimizer) or rec.here(2))
            except Exception as exc:
                rec.internal_error("optimizer construction", exc)
            return result

        return add_param_group

    def _construction_site(self, optimizer):
        """For an optimizer class the script writes itself (Lion, LARS, SAM), the line that
        builds it, not its ``super().__init__(params, defaults)``: the user's frames of that
        object's ``__init__`` chain are passed over. None when no such frame is on the stack."""
        finder = self.rec.finder
        inside = False
        for frame in finder.user_frames(sys._getframe(1)):
            if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is optimizer:
                inside = True
                continue
            return finder.location(frame) if inside else None
        return None

    def _register(self, optimizer, groups, loc) -> None:
        rec = self.rec
        pids = []
        params = []
        for group in groups:
            for p in group["params"]:
                pids.append(rec.track(p))
                params.append(p)
        self._owned.update(dict.fromkeys(pids))
        opt = rec.optimizer_id(optimizer)
        rec.add_params(opt, pids)
        unread = [unread_keys(optimizer, g) for g in groups]
        rec.emit(ev.optimizer_init(opt=opt, cls=type(optimizer).__name__, params=pids,
                                   lrs=[plain_number(g.get("lr")) for g in groups],
                                   hyper=[group_hyper(g) for g in groups],
                                   aliases=self._aliases(opt, params, pids),
                                   unread=unread if any(unread) else None,
                                   settings=sorted(k for k in optimizer.defaults if type(k) is str)
                                   if any(unread) else None), loc)
        for subscriber in self._params_added.now:
            subscriber(opt, pids)

    def _aliases(self, opt: int, params: list, pids: list[int]) -> list[list[int]]:
        """``[earlier pid, pid]`` for each parameter whose memory starts where one this
        optimizer was given before does (the same tensor listed twice; a second Parameter over
        one storage, made by ``nn.Parameter(other)`` or ``p.data = other.data``): each step
        updates that memory twice. One dict lookup per parameter, at construction only; plain
        tensors and Parameters only (no DTensor, no lazy parameter), none empty."""
        found: list[list[int]] = []
        try:
            if opt not in self._starts:
                while len(self._starts) >= _ALIAS_OPTIMIZERS:  # an optimizer rebuilt every step
                    oldest = next(iter(self._starts))
                    del self._starts[oldest], self._listed[oldest]
                self._starts[opt], self._listed[opt] = {}, set()
            starts, listed = self._starts[opt], self._listed[opt]
            for p, pid in zip(params, pids):
                if (type(p) is not Tensor and type(p) is not torch.nn.Parameter) or p.is_meta \
                        or not p.numel():
                    continue
                first = starts.setdefault((p.device, p.data_ptr()), pid)
                if first != pid or pid in listed:
                    found.append([first, pid])
                listed.add(pid)
        except Exception as exc:
            self.rec.internal_error("optimizer construction (shared parameters)", exc)
        return found

    def owned_pids(self) -> Mapping[int, None]:
        """The pids of every tensor an optimizer owns, as a live read-only view (``pid in``):
        kept current by this watcher, read by others in their hot loops."""
        return MappingProxyType(self._owned)

    def adopt_existing(self, loc, variables) -> None:
        """Optimizers made before a ``watch()`` block began: those the caller's variables hold
        (directly, or one attribute or item deep: ``self.optimizer``, ``trainer.optimizers[0]``)
        are registered now, as if made at ``loc`` (where the block begins); any other the
        first time the block steps or zero_grads it (one left alive by earlier code is never
        mentioned). No ``gc`` scan: entering a block stays cheap."""
        from torch.optim import Optimizer

        def is_optimizer(obj) -> bool:
            return issubclass(type(obj), Optimizer)  # type(): no __class__ tricks

        self.adopt_unknown = True
        held: dict[int, object] = {}
        for value in variables:
            inner = []
            if isinstance(value, (list, tuple, set, frozenset)):
                inner = list(value)
            elif isinstance(value, dict):
                inner = list(value.values())
            elif not isinstance(value, type):
                attrs = getattr(value, "__dict__", None)
                if isinstance(attrs, dict):
                    inner = list(attrs.values())
                    for item in list(inner):
                        if isinstance(item, (list, tuple)):
                            inner.extend(item)
            for obj in (value, *inner):
                if is_optimizer(obj):
                    held.setdefault(id(obj), obj)
        for optimizer in held.values():
            self._adopt(optimizer, loc)

    def _adopt(self, optimizer, loc) -> None:
        try:
            if getattr(optimizer, "param_groups", None):
                self._register(optimizer, optimizer.param_groups, loc)
        except Exception as exc:
            self.rec.internal_error("optimizer made before the watch", exc)

    def _adopt_unknown(self, optimizer, loc) -> None:
        """An optimizer made before the watch, first used now: registered here."""
        if self.rec.optimizer_id(optimizer) not in self.rec.opt_params:
            self._adopt(optimizer, loc)

    # -- zero_grad -----------------------------------------------------------------------
    def _wrap_zero_grad(self, original, via: str):
        watcher, rec = self, self.rec
        steady_path = via == "optimizer.zero_grad"  # the straight-line path (_steady_clear)

        @functools.wraps(original)
        def zero_grad(obj, *args, **kwargs):
            if watcher._clearing:
                return original(obj, *args, **kwargs)
            watcher._read = None  # a step that raised left its grads held there: let them go
            watcher._clearing = True
            try:
                result = original(obj, *args, **kwargs)
            finally:
                watcher._clearing = False
            try:
                armed = watcher._armed_clear
                if not (armed is not None and steady_path and not args and not kwargs
                        and watcher._steady_clear(obj, sys._getframe(1), armed)):
                    watcher._record_clear(obj, via, args, kwargs)
            except Exception as exc:
                rec.internal_error(via, exc)
            return result

        return zero_grad

    def _record_clear(self, obj, via: str, args, kwargs) -> None:
        rec = self.rec
        optimizer = via == "optimizer.zero_grad"
        if optimizer and self.adopt_unknown:
            self._adopt_unknown(obj, rec.here(3))
        set_to_none = kwargs.get("set_to_none", args[0] if args else True) if args or kwargs else True
        if optimizer:
            opt = rec.optimizer_id(obj)
            owned = rec.opt_params.get(opt)
            if set_to_none and owned is not None:
                # every grad is None now: the next backward sees fresh grads without our help,
                # so the per-parameter bookkeeping is not needed (hot path, every update); the
                # optimizer's own pid list, shared (Recorder.add_params never changes one)
                pids = owned
            else:
                pids = rec.grads.cleared([p for g in obj.param_groups for p in g["params"]])
        else:
            opt = None
            pids = rec.grads.cleared(list(obj.parameters()))
        try:  # rec.here(3) and rec.caller_of(3), in one walk up the stack
            loc, caller = rec.finder.here_and_caller(2)
        except Exception:  # as those two: each None when its lookup fails
            loc, caller = rec.here(3), rec.caller_of(3)
        event = rec.emit(ev.clear(via=via, opt=opt, set_to_none=bool(set_to_none), params=pids,
                                  caller=_json(caller)), loc)
        self._armed_clear = None
        if (optimizer and pids is owned and not args and not kwargs and not self.adopt_unknown
                and rec.folder is not None):
            place = rec.folder.place_of(event)
            if place is not None:
                self._arm_clear(place, opt, pids, sys._getframe(2), event, loc, caller)

    # -- the steady state: straight-line hooks (instrument/fold.py, Folder.steady_take) --------
    # While the folder's steady state lasts, each of a turn's hooks (zero_grad, the step's pre
    # and post hooks, the backward's wrapper) compares what decides its event with what it read
    # when its event last went the full path onto the steady path ("armed"); the same, and its
    # event is taken as that one (Folder.steady_take: no event made, nothing compared later);
    # anything else, and the full path runs at once (its event then goes the usual way).
    def _arm_clear(self, place, opt, pids, frame, event, loc, caller) -> None:
        finder = self.rec.finder
        chain = finder.chain(frame)
        if chain is None or loc is None:
            return
        user = same_chain(frame, chain)
        if user is None or finder.instruction_location(user) is not loc:
            return
        if chain[1].co_name == "<module>":
            outer = None  # no caller at module level
        else:
            up = user.f_back
            outer = False if up is None or not finder.is_user_file(up.f_code.co_filename) \
                else (up.f_code, up.f_lasti)
            if (outer and finder.instruction_location(up) != caller) or (not outer and caller is not None):
                return
        self._armed_clear = (*place, opt, pids, chain, outer, event.data, loc)

    def _steady_clear(self, obj, frame, armed) -> bool:
        """``optimizer.zero_grad()`` on the straight-line path: the same optimizer, its same
        parameter list, no arguments (set_to_none), the same call site and caller: the clear
        event it would record is the armed one. True: taken (nothing else to record)."""
        steady, j, opt, pids, chain, outer, base, loc = armed
        rec = self.rec
        folder = rec.folder
        if (folder is None or folder.steady is not steady or rec.holder is not None
                or self.adopt_unknown or get_ident() != rec.script_thread
                or rec.optimizer_id.refs[opt]() is not obj or rec.opt_params.get(opt) is not pids):
            return False
        codes, code, lasti = chain  # same_chain(frame, chain), inlined (a frame per turn)
        user = frame
        for expected in codes:
            if user is None or user.f_code is not expected:
                return False
            user = user.f_back
        if user is None or user.f_code is not code or user.f_lasti != lasti:
            return False
        if outer is not None:
            up = user.f_back
            if outer:
                if up is None or up.f_code is not outer[0] or up.f_lasti != outer[1]:
                    return False
            elif up is not None and self.rec.finder.is_user_file(up.f_code.co_filename):
                return False
        grads = rec.grads
        if (grads.behind_params is not None or grads.behind_grads is not None) \
                and not folder.skimming(steady, j):
            grads.catch_up()  # a sampled turn: its reads compare with what is there from now on
        with rec.lock:
            return folder.steady_take(steady, j, "clear", loc, base, None)

    # -- step ----------------------------------------------------------------------------
    def _outer_steps_running(self) -> int:
        """How many of the steps we saw begin are still running: their frames are on the stack.
        A step that raised never reached its post hook; dropping it here keeps one exception
        (the user's, or our own StopReplay in an L-BFGS closure) from hiding every later step."""
        if self._step_frames:
            on_stack = set()
            frame = sys._getframe(2)
            while frame is not None:
                on_stack.add(id(frame))
                frame = frame.f_back
            self._step_frames = [f for f in self._step_frames if id(f) in on_stack]
            if not self._step_frames:
                self.closure_step = None
        return len(self._step_frames)

    def _pre_step(self, optimizer, args, kwargs) -> None:
        armed = self._armed_begin
        if armed is not None:
            if self._steady_begin(optimizer, args, kwargs, sys._getframe(1), armed):
                return
            self._armed_begin = None
        rec = self.rec
        if self.adopt_unknown:
            self._adopt_unknown(optimizer, rec.here(2))
        depth = self._outer_steps_running()
        if depth == 0 and rec.progress.stop_requested:
            rec.progress.maybe_stop(rec.optimizer_id(optimizer))
        wrapper_frame = sys._getframe(1)  # the frame of the optimizer's step wrapper
        self._step_frames.append(wrapper_frame)
        if depth > 0:  # an optimizer that steps an inner optimizer
            return
        self._backwards_before = rec.progress.backward_calls
        try:
            closure = _has_closure(args, kwargs)
            opt = rec.optimizer_id(optimizer)
            # a step run from inside a backward (the optimizer fused into it by a post-accumulate
            # hook) sees grads the running backward just wrote: not edits
            edited: list[int] | None = None if rec.running_backwards and rec.in_backward() else []
            norm_pids: list[int] | None = []
            norms: list[float] | None = []
            nonfinite: list[int] = []
            frozen: list[int] = []
            by_hand: list[int] = []
            self._read = None
            if not closure:
                read = step_grads(rec, rec.opt_params.get(opt, ()), edited,
                                  self.scalers.in_scaler_step, frozen, by_hand)
                if edited is not None and read.states is not None:
                    edited.extend(self._untracked_edits(read, edited))
                self._read = (opt, read)  # for the post hook: the grads as the step got them
                if read.vouched and not self._wants_norms(opt):
                    norm_pids = norms = None  # finite, as a clip or unscale_ already saw
                else:
                    norm_pids, norms = norms_by_device(read.by_device())
                    sparse_pids, sparse_norms = read.sparse_norms()
                    if sparse_pids:  # an embedding's sparse grad: its own norm, measured alike
                        norm_pids, norms = norm_pids + sparse_pids, norms + sparse_norms
                    if not all(map(math.isfinite, norms)):
                        nonfinite = [pid for pid, n in zip(norm_pids, norms)
                                     if not math.isfinite(n) and _really_nonfinite(rec, pid)]
                    for subscriber in self._step_norms.now:
                        subscriber(norm_pids, norms)
                self._divergence.observe(opt, norms)
                for subscriber in self._step_grads.now:
                    subscriber(opt, optimizer, read.by_device(), norm_pids, norms)
                for subscriber in self._step_begins.now:
                    subscriber(opt, optimizer)
            elif self._divergence.skimming:  # a closure step after skimmed ones: counted
                self._divergence.settle(opt)
            moved = self._moves.moved()
            loc = rec.here(3)
            self._began = (wrapper_frame, optimizer, opt, loc)
            if edited and self.closure_step is None:  # L-BFGS-style closures recompute grads themselves
                factors = None
                if not self.edit_factors.done:  # by what constant, on the first edited steps
                    try:
                        factors = self.edit_factors.factors(rec.progress.backward_calls, optimizer,
                                                            rec.opt_params.get(opt, ()), edited)
                    except Exception as exc:
                        rec.internal_error("optimizer step (edit factors)", exc)
                rec.emit(ev.grad_edit(opt=opt, params=edited, factors=factors), loc)
            event = rec.emit(ev.step_begin(opt=opt, closure=closure, norm_pids=norm_pids,
                                           norms=norms, nonfinite=nonfinite,
                                           frozen=self._frozen_entries(optimizer, frozen) if frozen else None,
                                           edited_params=by_hand, moved=moved,
                                           lrs=group_lrs(optimizer)),
                             loc)
            if closure:
                self.closure_step = opt
            elif (depth == 0 and not self.adopt_unknown and edited == [] and not frozen
                    and not by_hand and not nonfinite and not moved
                    # (no norms: the grads vouched finite by a clip; not by a GradScaler's
                    # unscale_, whose vouch holds inside its step only)
                    and (norms is not None or not self.scalers.in_scaler_step)
                    and len(args) == 1 and not kwargs and rec.folder is not None
                    and self._read is not None and self._read[1].owned is not None
                    and self._read[1].states is not None and self._read[1].known
                    and not self._read[1].without):
                self._arm_begin(opt, wrapper_frame, event, loc)
        except Exception as exc:
            rec.internal_error("optimizer step (before)", exc)

    def _unscaled(self, pids: list[int]) -> None:
        """``GradScaler.unscale_`` divided these grads in place: what a later edit through
        ``.data`` is compared with from now on. Samples older than the latest backward are
        never compared again (``EditFactors.untracked`` and ``factors`` read only the latest
        backward's): past the sampled backwards nothing is read (as the clip's ``_follow``)."""
        try:
            factors = self.edit_factors
            if factors.sampled_at(self.rec.progress.backward_calls):
                factors.rebase(pids, grads_of(tensors_of(self.rec.tensors.refs, pids)))
        except Exception as exc:
            self.rec.internal_error("GradScaler.unscale_ (edit samples)", exc)

    @property
    def step_armed(self) -> bool:
        """Whether a step's pre hook is armed for the straight-line path (its turns repeat
        with nothing edited between backward and step)."""
        return self._armed_begin is not None

    def _untracked_edits(self, read: StepGrads, edited: list[int]) -> list[int]:
        """The grads edited through ``.data`` since the latest backward (``p.grad.data.zero_()``:
        no version bump, see editfactor.py), on the steps right after a sampled backward. Left
        out: runs of several ranks (a collective on ``p.grad.data`` moves no version counter
        either)."""
        rec = self.rec
        try:
            if not self.edit_factors.sampled_at(rec.progress.backward_calls) or _several_ranks():
                return []
            skip = set(edited)
            return self.edit_factors.untracked(rec.progress.backward_calls, read.pids, read.grads,
                                               skip)
        except Exception as exc:
            rec.internal_error("optimizer step (edits through .data)", exc)
            return []

    def _arm_begin(self, opt: int, wrapper_frame, event, loc) -> None:
        """After a step's pre hook whose event went onto the steady path (the full path found
        nothing edited, frozen, moved or not finite; every owned parameter had a plain grad):
        what ``_steady_begin`` compares with."""
        rec = self.rec
        place = rec.folder.place_of(event)
        if place is None or loc is None or not all(map(_is_cpu, self._read[1].grads)):
            return  # (the straight-line path's norm pass is the host path's: CPU grads)
        chain = rec.finder.chain(wrapper_frame)
        user = same_chain(wrapper_frame, chain) if chain is not None else None
        if user is None or rec.finder.instruction_location(user) is not loc:
            return
        self._armed_begin = (*place, opt, self._read[1].pids, chain, event.data, loc)

    def _steady_begin(self, optimizer, args, kwargs, wrapper_frame, armed) -> bool:
        """The step's pre hook on the straight-line path: ``step_grads``' reads compared as
        whole lists with what the armed step's full path found (the same owned parameters
        alive, each with a plain CPU grad that the backward wrote and nothing changed since,
        no parameter changed by hand, nothing frozen, nothing unowned to watch), then the norm
        pass: every norm finite, and the step_begin event is the armed one's with this step's
        norms and lrs. False before anything is changed: the full path."""
        steady, j, opt, pids, chain, base, loc = armed
        rec = self.rec
        folder = rec.folder
        grads_state = rec.grads
        # armed by a step whose grads a clip had vouched finite (no norm pass, no norms in its
        # event): only skimmed turns take the short path (the same event, no norms); any other
        # turn goes the full path, which finds them vouched again
        vouched = base["norms"] is None
        if (folder is None or folder.steady is not steady or rec.holder is not None
                or self._step_frames or self.adopt_unknown or len(args) != 1 or kwargs
                or rec.progress.stop_requested or rec.running_backwards
                or get_ident() != rec.script_thread
                or (not vouched and grads_state.any_vouched())
                or rec.optimizer_id.refs[opt]() is not optimizer
                or rec.opt_params.get(opt) is not pids):
            return False
        moves = self._moves
        refs = rec.tensors.refs
        if moves.watched or len(refs) != moves.known:
            return False
        codes, code, lasti = chain  # same_chain(wrapper_frame, chain), inlined
        user = wrapper_frame
        for expected in codes:
            if user is None or user.f_code is not expected:
                return False
            user = user.f_back
        if user is None or user.f_code is not code or user.f_lasti != lasti:
            return False
        sampled = self._sampled_norms
        # a skimmed place but the first is one steady_take takes (steady_ready); the step
        # budget's last updates are never skimmed (their norms are the ones the ``--grad-flow``
        # view and the run's last turns show)
        # (skimming's answer for a later place of a turn it answered, read here: no call)
        if ((vouched or (sampled is not None and sampled[0] is pids))
                and ((j and steady.skim_answer and steady.skim_turn == steady.closed
                      and len(steady.open) == j)
                     or (folder.skimming(steady, j) and (j or folder.steady_ready(steady, j))))):
            budget = rec.progress.step_budget
            if budget is None or rec.progress.updates + 3 + fold.CONTEXT < budget:
                return self._skim_begin(optimizer, wrapper_frame, armed,
                                        None if vouched else sampled[1])
        if vouched or not folder.steady_ready(steady, j):
            return False
        try:
            tensors = tensors_of(refs, pids)
            if not all(map(is_not, tensors, repeat(None))):
                return False
            requires = list(map(_requires_grad, tensors))
            grads = grads_of(tensors)
            if (not all(requires) or not all(map(is_not, grads, repeat(None)))
                    or not all(map(is_, map(type, grads), repeat(Tensor)))):
                return False
            now = list(map(_version, tensors))
            if now != list(map(grads_state.param_version.get, pids, now)):
                return False
            versions = list(map(_version, grads))
            states = list(zip(map(id, grads), versions))
            if list(map(grads_state.known.get, pids)) != states:
                return False
            # norms_by_device's host path: one group of dense grads, on the CPU, no graph
            if (not all(map(_is_cpu, grads)) or any(map(_is_sparse, grads))
                    or (_grad_enabled() and any(map(_requires_grad, grads)))):
                return False
            norms = list(map(_item, torch._foreach_norm(grads)))
            if not all(map(math.isfinite, norms)):
                return False
        except Exception:  # the full path, which records its own failures
            return False
        self._sampled_norms = (pids, norms)  # what the skimmed steps until the next sample carry
        # the full path's changes, in its order
        grads_state.note_requires_grad(pids, requires)
        self._step_frames.append(wrapper_frame)
        self._backwards_before = rec.progress.backward_calls
        try:
            read = StepGrads(pids, grads, states, [], False, versions=versions,
                             owned=(pids, tensors, grads), known=True)
            self._read = (opt, read)
            norm_pids = list(pids)
            for subscriber in self._step_norms.now:
                subscriber(norm_pids, norms)
            self._divergence.observe(opt, norms)
            for subscriber in self._step_grads.now:
                subscriber(opt, optimizer, read.by_device(), norm_pids, norms)
            for subscriber in self._step_begins.now:
                subscriber(opt, optimizer)
            moved = moves.moved()  # nothing, unless a subscriber tracked a tensor meanwhile
            self._began = (wrapper_frame, optimizer, opt, loc)
            lrs = group_lrs(optimizer)
            taken = False
            if not moved:
                with rec.lock:
                    taken = folder.steady_take(steady, j, "step_begin", loc, base,
                                               {"norms": norms, "lrs": lrs})
            if not taken:
                self._armed_begin = None
                rec.emit(ev.step_begin(opt=opt, closure=False, norm_pids=norm_pids, norms=norms,
                                       nonfinite=[], frozen=None, edited_params=[], moved=moved,
                                       lrs=lrs), loc)
        except Exception as exc:
            rec.internal_error("optimizer step (before)", exc)
        return True

    def _skim_begin(self, optimizer, wrapper_frame, armed, norms) -> bool:
        """The step's pre hook on a skimmed turn (``Folder.skimming``): what
        ``_steady_begin`` checked up to here (the same optimizer and parameter list, thread,
        arguments, call site, nothing frozen-watched or moved) and nothing else read; the
        step_begin event is the armed one with the last sampled turn's norms and this step's
        lrs. No norm pass, no grad reads: the norm subscribers and the picture skip this
        update, and ``Divergence`` sees a gap (no run of growth spans a skimmed update; told
        at the first skimmed update of a stretch, it counts the others later). The
        post hook notes nothing either (``GradState.behind_params``)."""
        steady, j, opt, pids, chain, base, loc = armed
        rec = self.rec
        folder = rec.folder
        self._step_frames.append(wrapper_frame)
        self._backwards_before = rec.progress.backward_calls
        try:
            self._read = None
            if opt not in self._divergence.skimming:  # the first of a stretch: told once
                self._divergence.skim(opt)
            moved = []  # (_steady_begin found nothing moved)
            begins = self._step_begins.now
            if begins:
                for subscriber in begins:
                    subscriber(opt, optimizer)
                moves = self._moves  # nothing moved, unless a subscriber tracked a tensor
                if moves.watched or len(rec.tensors.refs) != moves.known:
                    moved = moves.moved()
            self._began = (wrapper_frame, optimizer, opt, loc)
            # group_lrs, for the one group of plain dict and float lr it reads most
            groups = getattr(optimizer, "param_groups", None)
            if (type(groups) is list and len(groups) == 1 and type(group := groups[0]) is dict
                    and type(lr := group.get("lr")) is float):
                lrs = [lr]
            else:
                lrs = group_lrs(optimizer)
            taken = False
            if not moved:
                with rec.lock:  # Folder.skim_take, its first branch inlined (a frame per turn)
                    turn = steady.open
                    if folder.steady is steady and len(turn) == j and j:
                        trace = folder.trace
                        turn.append((trace.next_seq, "step_begin", loc, base,
                                     {"norms": norms, "lrs": lrs}))
                        trace.next_seq += 1
                        taken = True
                    else:
                        taken = folder.steady_take(steady, j, "step_begin", loc, base,
                                                   {"norms": norms, "lrs": lrs})
            if not taken:  # the event of the full path, its grads read now
                self._armed_begin = None
                norm_pids, norms = grad_norms(rec, pids) if norms is not None else (None, None)
                rec.emit(ev.step_begin(opt=opt, closure=False, norm_pids=norm_pids, norms=norms,
                                       nonfinite=[pid for pid, n in zip(norm_pids or (), norms or ())
                                                  if not math.isfinite(n)],
                                       frozen=None, edited_params=[], moved=moved, lrs=lrs), loc)
        except Exception as exc:
            rec.internal_error("optimizer step (before)", exc)
        return True

    def _frozen_entries(self, optimizer, pids: list[int]) -> list[list]:
        """``[pid, moved_by, freeze]`` for the frozen parameters with a ``.grad`` that are still
        in one of the optimizer's param groups (one removed from them is not updated). Only
        runs when there are some (a frozen parameter keeps a grad only with
        ``zero_grad(set_to_none=False)`` or a grad set by hand). Its own failure loses only
        these entries, not the step's event."""
        try:
            group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
            state = optimizer.state
            entries = []
            for pid in pids:
                param = self.rec.tensor(pid)
                group = group_of.get(id(param)) if param is not None else None
                if group is None:
                    continue
                entries.append([pid, zero_grad_mover(optimizer, group, state.get(param)),
                                self._freeze_seq(param)])
            return entries
        except Exception as exc:
            self.rec.internal_error("optimizer step (frozen parameters)", exc)
            return []

    def _freeze_seq(self, param) -> int | None:
        """The seq of the event that froze ``param`` (the mode watcher's), if one did."""
        return next((seq for answer in self._freeze_of.now if (seq := answer(param)) is not None),
                    None)

    def _wants_norms(self, opt: int) -> bool:
        """Per-layer norms (the ``--grad-flow`` view) even when the grads are vouched finite:
        on each optimizer's first update and on every update from the step budget's last one
        on (the replay's final updates, the ones the view shows)."""
        if opt not in self._normed:
            self._normed.add(opt)
            return True
        budget = self.rec.progress.step_budget
        return budget is not None and self.rec.progress.updates + 1 >= budget

    def _post_step(self, optimizer, args, kwargs) -> None:
        armed = self._armed_step
        if armed is not None:
            # the pre hook skimmed (it read nothing): this turn is skimmed too, unless it ended
            if (self._skim_step if self._read is None else self._steady_step)(
                    optimizer, args, kwargs, sys._getframe(1), armed):
                return
            self._armed_step = None
        rec = self.rec
        frame = self._step_frames.pop() if self._step_frames else None
        if self._step_frames:
            return
        began, self._began = self._began, None
        if began is not None and began[0] is frame and began[1] is optimizer \
                and frame is sys._getframe(1):
            opt, loc = began[2], began[3]
        else:
            opt, loc = rec.optimizer_id(optimizer), None
        rec.progress.count_step(opt)  # before the listeners: rec.progress.steps includes this step
        try:
            self.closure_step = None
            # a closure that ran no backward (Lightning passes one to every step, manual
            # optimization's does nothing) leaves the gradients to the loop: a plain step
            closure = _has_closure(args, kwargs) and rec.progress.backward_calls > self._backwards_before
            read, self._read = self._read, None
            if read is not None and (read[0] != opt or closure):
                read = None
            torch_step = _torch_step(optimizer)
            grads_read = read[1] if read is not None else None
            untouched = self._untouched(opt, grads_read) if torch_step else None
            # a plain call of torch's step with no step hooks of the optimizer's own: the
            # versions it leaves are predicted once learned (``GradState._versions_after``)
            predictable = (torch_step and len(args) == 1 and not kwargs
                           and not getattr(optimizer, "_optimizer_step_pre_hooks", True)
                           and not getattr(optimizer, "_optimizer_step_post_hooks", True))
            without = rec.grads.after_step(
                rec.opt_params.get(opt, ()), grads_read, keeps_grads=torch_step,
                untouched=untouched, predictable=predictable)
            if len(without) >= SAME_LIST_MIN:  # held once where equal to a list the trace holds
                without = rec.same_list(without)
            event = rec.emit(ev.step(opt=opt, closure=closure, skipped=False, without_grad=without),
                             loc if loc is not None else rec.here(3))
            if (loc is not None and untouched and not closure and not without
                    and grads_read is not None and grads_read.known and len(args) == 1
                    and not kwargs and self._untouched_steps.get(opt, 0) >= TRUSTED_AFTER
                    and rec.folder is not None):
                place = rec.folder.place_of(event)
                if place is not None:
                    # (and the step the instance holds, if any: torch's, _torch_step found)
                    self._armed_step = (*place, opt, rec.opt_params.get(opt), event.data, loc,
                                        vars(optimizer).get("step"))
            if without:  # a step with every grad there is only counted (Progress.stepped)
                for subscriber in self._stepped_without_grad.now:
                    subscriber(opt, without)
            for subscriber in self._stepped.now:
                subscriber(opt, optimizer)
        except Exception as exc:
            rec.internal_error("optimizer step (after)", exc)

    def _steady_step(self, optimizer, args, kwargs, frame, armed) -> bool:
        """The step's post hook on the straight-line path: the step whose pre hook went the
        straight-line path (or armed it) and one of torch's, trusted to leave its grads as it
        got them (``_untouched``), ends as the armed one did: the parameters' versions noted,
        the step counted, its event the armed one's. False before anything is changed."""
        steady, j, opt, pids, base, loc, own_step = armed
        rec = self.rec
        folder = rec.folder
        frames, began, read = self._step_frames, self._began, self._read
        if (folder is None or folder.steady is not steady or rec.holder is not None
                or len(frames) != 1 or frames[0] is not frame or began is None
                or began[0] is not frame or began[1] is not optimizer or began[2] != opt
                or began[3] is not loc or read is None or read[0] != opt
                or len(args) != 1 or kwargs or get_ident() != rec.script_thread
                or rec.opt_params.get(opt) is not pids
                or self._untouched_steps.get(opt, 0) < TRUSTED_AFTER
                or not folder.steady_ready(steady, j)):
            return False
        grads_read = read[1]
        owned = grads_read.owned
        if (owned is None or owned[0] is not pids or len(owned[1]) != len(pids)
                or grads_read.states is None or not grads_read.known or grads_read.without
                or not _torch_step(optimizer)):
            return False
        frames.pop()
        self._began = None
        rec.progress.count_step(opt)
        try:
            self.closure_step = None
            self._read = None
            rec.grads.note_param_versions(pids, owned[1])
            without = grads_read.without
            with rec.lock:
                taken = folder.steady_take(steady, j, "step", loc, base, None)
            if not taken:
                self._armed_step = None
                rec.emit(ev.step(opt=opt, closure=False, skipped=False, without_grad=without), loc)
            for subscriber in self._stepped.now:
                subscriber(opt, optimizer)
        except Exception as exc:
            rec.internal_error("optimizer step (after)", exc)
        return True

    def _skim_step(self, optimizer, args, kwargs, frame, armed) -> bool:
        """The step's post hook on a skimmed turn: ``_steady_step``'s tests but those of the
        grads' read (its pre hook read none), the parameters' versions left to
        ``GradState.catch_up``. False before anything is changed: the full path."""
        steady, j, opt, pids, base, loc, own_step = armed
        rec = self.rec
        folder = rec.folder
        frames, began = self._step_frames, self._began
        # (the steady state still ``steady``: skimming's first test). ``began`` is the pre
        # hook's of this very call (its wrapper frame, the only one running): the thread it
        # tested is this call's. (The arguments are tested again: a full-path pre hook of a
        # closure step leaves ``began`` too.)
        if (began is None or began[0] is not frame or len(frames) != 1 or frames[0] is not frame
                or began[1] is not optimizer or began[2] != opt or began[3] is not loc
                or len(args) != 1 or kwargs or rec.holder is not None or folder is None
                or rec.opt_params.get(opt) is not pids
                or not ((steady.skim_answer and steady.skim_turn == steady.closed
                         and len(steady.open) == j and folder.steady is steady)
                        or folder.skimming(steady, j))
                or (vars(optimizer).get("step") is not own_step and not _torch_step(optimizer))):
            return False
        # (trusted to leave its grads as it got them: armed only once _untouched_steps reached
        # TRUSTED_AFTER, which it never leaves; one of torch's steps when armed, and its class
        # and its own step attribute the same since)
        frames.pop()
        self._began = None
        rec.progress.count_thread_step(opt, rec.script_thread)
        try:
            self.closure_step = None
            rec.grads.skimmed_step(pids)
            with rec.lock:  # Folder.skim_take, its first branch inlined (a frame per turn)
                turn = steady.open
                if folder.steady is steady and len(turn) == j and j:
                    trace = folder.trace
                    turn.append((trace.next_seq, "step", loc, base, None))
                    trace.next_seq += 1
                    taken = True
                else:
                    taken = folder.steady_take(steady, j, "step", loc, base, None)
            if not taken:
                self._armed_step = None
                rec.emit(ev.step(opt=opt, closure=False, skipped=False, without_grad=[]), loc)
            for subscriber in self._stepped.now:
                subscriber(opt, optimizer)
        except Exception as exc:
            rec.internal_error("optimizer step (after)", exc)
        return True

    def _untouched(self, opt: int, read: StepGrads | None) -> bool | None:
        """Whether the step of torch optimizer ``opt`` just left its grads' values as it got
        them; None: unknown (``GradState.after_step`` compares the versions itself).

        Some configurations of torch's optimizers change ``.grad`` in place (SGD's foreach
        nesterov adds the momentum into it, from its first step); which ones is decided by the
        configuration, not the data (``tests/test_step_reads.py`` scans them): an optimizer whose first ``TRUSTED_AFTER`` steps left
        every grad's version unchanged is trusted to go on, and its grads are not read again
        after each step (a cold pass over every grad, ~1 ms per 1,000 tensors). One that changed
        them is compared after every step."""
        if read is None:
            return None
        seen = self._untouched_steps.get(opt, 0)
        if seen >= TRUSTED_AFTER:
            return True
        if seen < 0:
            return None
        untouched = read.untouched()
        self._untouched_steps[opt] = seen + 1 if untouched else -1
        return untouched

    # -- hyper-parameters set as attributes ------------------------------------------------
    def _wrap_setattr(self, original):
        watcher = self

        def __setattr__(optimizer, name, value):
            original(optimizer, name, value)  # first, exactly as without graddoctor
            try:
                attrs = optimizer.__dict__
                key = _KEY_ALIASES.get(name, name)
                defaults = attrs.get("defaults")
                # constructed (torch's own __init__ sets its attributes before param_groups)
                # and a hyper-parameter: anything else costs these lookups only
                if "param_groups" in attrs and isinstance(defaults, dict) and key in defaults:
                    watcher._attribute_set(optimizer, name, key, value)
            except Exception as exc:
                watcher.rec.internal_error("optimizer attribute", exc)

        return __setattr__

    def _attribute_set(self, optimizer, name: str, key: str, value) -> None:
        """``optimizer.<name> = value`` by the user's code: recorded once per line, optimizer
        and name, unless the step reads the attribute or the groups already hold the value."""
        rec = self.rec
        caller = sys._getframe(2)  # the frame that assigned (below: __setattr__, this method)
        if not rec.finder.is_user_file(caller.f_code.co_filename):
            return  # torch or a library setting its own attribute
        if not _steps_with_param_groups(optimizer, name):
            return
        loc = rec.here(3)
        if loc is None:
            return
        opt = rec.optimizer_id(optimizer)
        seen = (loc.path, loc.line, opt, name)
        if seen in self._attrs_seen:
            return
        number = _number(value)
        kept = [_number(group.get(key)) for group in optimizer.param_groups]
        if number is not None and kept and all(k == number for k in kept):
            return  # the groups step with that value anyway
        self._attrs_seen.add(seen)
        rec.emit_aside(ev.optimizer_attr(opt=opt, cls=type(optimizer).__name__, name=name,
                                         key=key, value=number, kept=kept), loc)

    def install(self, patcher) -> None:
        Optimizer, Module = torch.optim.Optimizer, torch.nn.Module
        patcher.patch(Optimizer, "__setattr__", self._wrap_setattr(Optimizer.__setattr__))
        patcher.patch(Optimizer, "add_param_group", self._wrap_add_param_group(Optimizer.add_param_group))
        patcher.patch(Optimizer, "zero_grad", self._wrap_zero_grad(Optimizer.zero_grad, "optimizer.zero_grad"))
        patcher.patch(Module, "zero_grad", self._wrap_zero_grad(Module.zero_grad, "module.zero_grad"))
        patcher.handle(register_optimizer_step_pre_hook(self._pre_step))
        patcher.handle(register_optimizer_step_post_hook(self._post_step))


def _json(location) -> list | None:
    """A location as event data: [path, line, function] (a list: folding hashes event data)."""
    return [location.path, location.line, location.function] if location is not None else None
