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

Cost: before the first optimizer step (model construction: every layer's ``reset_parameters``)
one comparison per call; after it, a pid lookup per tensor touched.
"""

from __future__ import annotations

import functools
import weakref

import torch

from .. import events as ev
from .recorder import Recorder
from .stateload import loaded_into_itself, nothing_loaded
from .topics import STATE_LOADED

MAX_STATES = 64  # distinct loaded states told apart; later ones are not compared

INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                "kaiming_normal_", "orthogonal_", "sparse_")


class ParamResetWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a live view
        self._busy = False  # an initialiser calling another (kaiming_uniform_ -> uniform_)
        # the states loaded so far (their number: the index), each as weak references to its
        # tensors: a state is the same when its tensors are the very same objects; nothing is
        # kept alive (a checkpoint loaded once must not stay in memory for the whole run)
        self._states: list[list[weakref.ref]] = []
        self._loading = rec.subscribers(STATE_LOADED)  # told of each load before it runs

    def _state_number(self, state_dict) -> int | None:
        """The number of the state whose tensors ``state_dict`` holds (a new one when first
        seen); None for a state that holds something else than tensors, or past
        ``MAX_STATES`` distinct ones."""
        values = list(state_dict.values())
        if not values or not all(isinstance(v, torch.Tensor) for v in values):
            return None
        for number, refs in enumerate(self._states):
            if len(refs) == len(values) and all(r() is v for r, v in zip(refs, values)):
                return number
        if len(self._states) >= MAX_STATES:
            return None
        self._states.append([weakref.ref(v) for v in values])
        return len(self._states) - 1

    def _owned_pids(self, tensors) -> list[int]:
        number, refs, owned = self.rec.tensors.number, self.rec.tensors.refs, self.owned
        pids = []
        for tensor in tensors:
            pid = number.get(id(tensor))
            if pid is not None and pid in owned and refs[pid]() is tensor:
                pids.append(pid)
        return pids

    def _record(self, via: str, pids: list[int], state: list | None = None) -> None:
        rec = self.rec
        rec.emit_aside(ev.param_reset(via=via, params=pids, state=state), rec.here(3))

    def _wrap_init(self, original, name: str):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def initialiser(tensor, *args, **kwargs):
            if watcher._busy or not rec.progress.steps:
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
                for loading in watcher._loading:
                    try:
                        loading(module, state_dict)
                    except Exception as exc:
                        rec.internal_error("load_state_dict", exc)
                result = original(module, state_dict, *args, **kwargs)
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
                                        None if number is None else [number, versions])
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
