"""Parameters an optimizer already stepped, set back by the script's own code: ``torch.nn.init``'s
in-place initialisers (a layer re-initialised in ``forward``, ``model.apply(init_weights)`` in the
loop) and ``Module.load_state_dict`` (the same saved state loaded again and again).

Each call from the user's code that touches optimizer-owned parameters (an initialiser: after
the first optimizer step) is recorded as a ``param_reset`` aside event: the initialiser or ``load_state_dict``,
the pids, and for ``load_state_dict`` which state was loaded (the very same tensors, held
through weak references, and their versions: the same, unchanged state loaded again undoes
every update since). The rule
(rules/params_reset_every_step.py) reports a reset between every two steps of an optimizer.

The wrapper of ``load_state_dict`` is the method's only one: watchers that want to see a state
about to be loaded subscribe to ``STATE_LOADED`` (the snapshot watcher, instrument/snapshots.py).

Each of the first ``FINGERPRINTS`` loads into optimizer-owned parameters also carries a
fingerprint of the state's values (a strided sample of its first floating tensors): a state
edited through ``.data`` between two loads keeps its versions but not its values (Reptile's
meta-weights), and the rules must not take it for the same, unchanged state. And each says
whether the module's ``state_dict()`` (or a holder's) was called since its previous load
(``STATE_TAKEN``): the values trained in between were saved, not lost (federated averaging's
clients).

Before the first optimizer step the same two wrappers see a checkpoint undone before training
starts: ``load_state_dict`` notes the parameters it placed (by their storage), and an
initialiser that writes one of them (``model.apply(init_weights)``, ``reset_parameters()``,
``nn.init.*_`` on the loaded weights, ``.data`` included) is noted against that load. A load
whose every placed weight (a tensor of two dimensions or more) an initialiser overwrote is
one ``state_overwritten`` event at the end of a run that stepped an optimizer (``close``):
the model trained from the initialisation, not from the state loaded. A later load that places
a tensor again takes it from the earlier one.

Cost: before the first optimizer step (model construction: every layer's ``reset_parameters``)
one comparison per call, and while a load's placed tensors are noted one dict lookup per
initialiser call; after it, a pid lookup per tensor touched; the first loads of a state
into stepped parameters, one small reduction each.
"""

from __future__ import annotations

import functools
import sys
import weakref

import torch

from .. import events as ev
from .recorder import Recorder
from .stateload import loaded_into_itself, nothing_loaded
from .topics import STATE_LOADED

MAX_STATES = 64  # distinct loaded states told apart; later ones are not compared
FINGERPRINTS = 32  # loads whose state's values get a fingerprint (one small reduction each)
_PRINT_TENSORS = 8  # floating tensors of a state sampled for it
_PRINT_VALUES = 64  # values sampled per tensor (evenly spaced)

INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                "kaiming_normal_", "orthogonal_", "sparse_")


def _memory(values) -> tuple | None:
    """Where each tensor's values live (device, address, shape, strides, dtype); None when one
    has no storage to tell it by (meta, empty)."""
    keys = []
    for v in values:
        try:
            ptr = v.data_ptr() if not v.is_meta else 0
        except Exception:  # no storage (a functorch wrapper, a fake tensor)
            return None
        if not ptr:
            return None
        keys.append((str(v.device), ptr, tuple(v.shape), tuple(v.stride()), str(v.dtype)))
    return tuple(keys)


def fingerprint(state_dict) -> float | None:
    """A weighted sum (float64) of at most ``_PRINT_VALUES`` evenly spaced values of each of the
    state's first ``_PRINT_TENSORS`` floating tensors; None when it holds none."""
    parts = []
    for value in state_dict.values():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                or value.numel() == 0 or value.is_meta:
            continue
        with torch.no_grad():
            flat = value.detach().reshape(-1)
            stride = max(1, flat.numel() // _PRINT_VALUES)
            sample = flat[::stride][:_PRINT_VALUES].double()
            weights = torch.arange(1, sample.numel() + 1, dtype=torch.float64, device=sample.device)
            parts.append((sample * weights).sum() * (len(parts) + 1))
        if len(parts) >= _PRINT_TENSORS:
            break
    if not parts:
        return None
    with torch.no_grad():
        total = float(torch.stack([p.to("cpu") for p in parts]).sum())
    return total if total == total else None  # NaN compares unequal to itself


MAX_LOADS = 16  # loads before the first step whose placed tensors are noted
_INIT_LINES = 4  # lines of the initialisers that overwrote a load, kept in its event


class _Load:
    """A ``load_state_dict`` before the first step: where, into what, the tensors it placed
    (storage key -> (weak ref, a weight of two dimensions or more)) and those an initialiser
    overwrote since (key -> (initialiser, its location, the parameter's pid))."""

    def __init__(self, loc, cls: str):
        self.loc, self.cls = loc, cls
        self.placed: dict[tuple, tuple[weakref.ref, bool]] = {}
        self.overwritten: dict[tuple, tuple] = {}


def _storage(tensor) -> tuple | None:
    """A tensor's storage (device, address, shape): a parameter and its ``.data`` share it."""
    try:
        if tensor.is_meta:
            return None
        ptr = tensor.data_ptr()
    except Exception:
        return None
    return (str(tensor.device), ptr, tuple(tensor.shape)) if ptr else None


class ParamResetWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a live view
        self._busy = False  # an initialiser calling another (kaiming_uniform_ -> uniform_)
        # the states loaded so far (their number: the index), each as weak references to its
        # tensors: a state is the same when its tensors are the very same objects; nothing is
        # kept alive (a checkpoint loaded once must not stay in memory for the whole run)
        self._states: list[tuple[list[weakref.ref], tuple | None]] = []  # (refs, _memory)
        self._loading = rec.subscribers(STATE_LOADED)  # told of each load before it runs
        self._printed = 0  # loads given a fingerprint of their state's values
        # state_dict() calls (STATE_TAKEN), numbered, by module: the last one's number; and the
        # number of the last call before each module's last load (the trained values saved
        # since then: ``kept``)
        self._takes = 0
        self._taken: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._loaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # before the first step: the loads (see the module docs) and each placed tensor's
        # storage key -> (weak ref, its load)
        self._loads: list[_Load] = []
        self._placed: dict[tuple, tuple[weakref.ref, _Load]] = {}

    def _state_number(self, state_dict) -> int | None:
        """The number of the state whose tensors ``state_dict`` holds (a new one when first
        seen); None for a state that holds something else than tensors, or past
        ``MAX_STATES`` distinct ones. The same state: the very same tensor objects, or tensors
        over the same memory (``module.state_dict()`` detaches each parameter anew at every
        call: ``q_net.load_state_dict(target_net.state_dict())`` in a loop loads one state);
        whether it changed in between is for the versions and the values to say."""
        values = list(state_dict.values())
        if not values or not all(isinstance(v, torch.Tensor) for v in values):
            return None
        keys = _memory(values)
        for number, (refs, known) in enumerate(self._states):
            if len(refs) == len(values) and (all(r() is v for r, v in zip(refs, values))
                                             or (keys is not None and known == keys)):
                return number
        if len(self._states) >= MAX_STATES:
            return None
        self._states.append(([weakref.ref(v) for v in values], keys))
        return len(self._states) - 1

    def _owned_pids(self, tensors) -> list[int]:
        number, refs, owned = self.rec.tensors.number, self.rec.tensors.refs, self.owned
        pids = []
        for tensor in tensors:
            pid = number.get(id(tensor))
            if pid is not None and pid in owned and refs[pid]() is tensor:
                pids.append(pid)
        return pids

    def _record(self, via: str, pids: list[int], state: list | None = None,
                values: float | None = None, kept: bool | None = None) -> None:
        rec = self.rec
        rec.emit_aside(ev.param_reset(via=via, params=pids, state=state, values=values, kept=kept),
                       rec.here(3))

    def taken(self, module) -> None:
        """``STATE_TAKEN``: the script called ``module.state_dict()``."""
        self._takes += 1
        if module in self._taken or len(self._taken) < MAX_STATES:
            self._taken[module] = self._takes

    def _kept(self, module) -> bool:
        """Whether ``module.state_dict()`` (or that of a module holding it) was called since
        the module's previous load: the values trained since then were saved (a client's
        update kept before the next round's global weights are loaded)."""
        since = self._loaded.get(module, 0)
        self._loaded[module] = self._takes
        for holder, number in list(self._taken.items()):
            if number > since and (holder is module or any(m is module for m in holder.modules())):
                return True
        return False

    def _fingerprint(self, state_dict) -> float | None:
        """A fingerprint of the state's values (see the module docs), for the first loads only."""
        if self._printed >= FINGERPRINTS:
            return None
        self._printed += 1
        try:
            return fingerprint(state_dict)
        except Exception:  # tensors without readable values (fake, functorch): no fingerprint
            return None

    def _note_placed(self, module, state_dict, result, loc) -> None:
        """The parameters a load before the first step placed (its keys, less the missing)."""
        if len(self._loads) >= MAX_LOADS:
            return
        missing = set(getattr(result, "missing_keys", ()) or ())
        keys = set(state_dict.keys())
        load = _Load(loc, type(module).__name__)
        for name, param in module.named_parameters():
            if name not in keys or name in missing:
                continue
            key = _storage(param)
            if key is None:
                continue
            before = self._placed.get(key)
            if before is not None:  # placed again: the earlier load's no more
                before[1].placed.pop(key, None)
                before[1].overwritten.pop(key, None)
            ref = weakref.ref(param)
            load.placed[key] = (ref, param.dim() >= 2)
            self._placed[key] = (ref, load)
        if load.placed:
            self._loads.append(load)

    def _overwrites(self, tensor, name: str) -> None:
        """An initialiser before the first step: is ``tensor`` (or its ``.data``) one a load
        placed?"""
        key = _storage(tensor)
        entry = self._placed.get(key) if key is not None else None
        if entry is None or entry[0]() is None:
            return
        load = entry[1]
        if key in load.placed and key not in load.overwritten:
            param = load.placed[key][0]()
            if param is not None:  # the parameter (the initialiser may be given its .data)
                load.overwritten[key] = (name, self._in_scope_of(load) or self.rec.here(4),
                                         self.rec.track(param))

    def _in_scope_of(self, load):
        """The statement, in the function that made the load, whose call led to this
        initialiser (``model.apply(init_weights)``, ``model.reset()``), not the line inside
        the helper; None when the load's function is not on the stack."""
        if load.loc is None:
            return None
        finder = self.rec.finder
        for frame in finder.user_frames(sys._getframe(3)):
            at = finder.instruction_location(frame)
            if at.path == load.loc.path and at.function == load.loc.function:
                return at
        return None

    def close(self) -> None:
        """At the end of the run: each load whose placed weights were all overwritten before
        the first step, when an optimizer stepped (``state_overwritten``)."""
        rec = self.rec
        if not rec.progress.steps:
            return
        for load in self._loads:
            weights = [key for key, (_, matrix) in load.placed.items() if matrix]
            if not weights or any(key not in load.overwritten for key in weights):
                continue
            params = [pid for _, _, pid in load.overwritten.values()]
            inits = list(dict.fromkeys((n, loc) for n, loc, _ in load.overwritten.values()))
            rec.emit_aside(ev.state_overwritten(
                cls=load.cls, params=params, weights=len(weights),
                via=list(dict.fromkeys(f"torch.nn.init.{n}" for n, _ in inits)),
                at=[[loc.path, loc.line, loc.function]
                    for loc in dict.fromkeys(loc for _, loc in inits) if loc is not None][:_INIT_LINES]),
                load.loc)

    def _wrap_init(self, original, name: str):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def initialiser(tensor, *args, **kwargs):
            if watcher._busy or not rec.progress.steps:
                if watcher._placed and not watcher._busy and not rec.progress.steps:
                    try:
                        watcher._overwrites(tensor, name)
                    except Exception as exc:
                        rec.internal_error(f"torch.nn.init.{name}", exc)
                return original(tensor, *args, **kwargs)
            watcher._busy = True
            try:
                try:
                    pids = watcher._owned_pids([tensor])
                    if pids:
                        watcher._record(f"torch.nn.init.{name}", pids)
                except Exception as exc:
                    rec.internal_error(f"torch.nn.init.{name}", exc)
                return original(tensor, *args, **kwargs)
            finally:
                watcher._busy = False

        return initialiser

    def _wrap_load(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def load_state_dict(module, state_dict, *args, **kwargs):
            if watcher._busy:  # (rare calls: recorded before the first step too, as the state
                return original(module, state_dict, *args, **kwargs)  # later loads compare to)
            watcher._busy = True
            try:
                try:
                    itself = loaded_into_itself(module, state_dict)
                    if itself is not None:
                        rec.emit_aside(ev.state_self_load(**itself), rec.here(2))
                except Exception as exc:
                    rec.internal_error("load_state_dict (itself)", exc)
                for loading in watcher._loading.now:
                    try:
                        loading(module, state_dict)
                    except Exception as exc:
                        rec.internal_error("load_state_dict", exc)
                result = original(module, state_dict, *args, **kwargs)
                if not rec.progress.steps:
                    try:
                        watcher._note_placed(module, state_dict, result, rec.here(2))
                    except Exception as exc:
                        rec.internal_error("load_state_dict (placed)", exc)
                try:
                    unloaded = nothing_loaded(module, state_dict, result)
                    if unloaded is not None:
                        rec.emit_aside(ev.state_not_loaded(**unloaded), rec.here(2))
                except Exception as exc:
                    rec.internal_error("load_state_dict (keys)", exc)
                try:
                    pids = watcher._owned_pids(module.parameters())
                    if pids:
                        number = watcher._state_number(state_dict)
                        versions = [getattr(v, "_version", None) for v in state_dict.values()]
                        watcher._record("load_state_dict", pids,
                                        None if number is None else [number, versions],
                                        watcher._fingerprint(state_dict), watcher._kept(module))
                except Exception as exc:
                    rec.internal_error("load_state_dict", exc)
                return result
            finally:
                watcher._busy = False

        return load_state_dict

    def install(self, patcher) -> None:
        init = torch.nn.init
        for name in INITIALISERS:
            original = getattr(init, name, None)
            if callable(original):
                patcher.patch(init, name, self._wrap_init(original, name))
        patcher.patch(torch.nn.Module, "load_state_dict",
                      self._wrap_load(torch.nn.Module.load_state_dict))
