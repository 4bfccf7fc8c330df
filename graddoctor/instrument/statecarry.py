"""A recurrent module's state carried from one DataLoader batch to the next while the batches
are unrelated samples (recurrent-state-across-shuffled-batches).

Carrying an RNN's final state into the next forward is truncated backpropagation through time:
right when row i of the next batch continues row i of this one (the word-language-model
``batchify``/``get_batch`` layout, served in order). A loader that draws its samples at random
(``shuffle=True``, a ``RandomSampler``) gives no such continuation: each sequence then starts
from the final state of another, unrelated sample. Nothing fails and the model trains.

Read at the first ``WINDOW`` backwards only, through a global module forward hook (removed
with the window; its call reads the forward's arguments and result, nothing else):

* For each forward of an ``nn.RNNBase`` (RNN, LSTM, GRU) or ``nn.RNNCellBase`` (RNNCell,
  LSTMCell, GRUCell), outside a backward (activation checkpointing's recompute), the state it
  returns (``h_n``, an LSTM's ``(h_n, c_n)``, a cell's output) is kept as detached aliases
  (storage held, no graph), with the DataLoader batch served last
  (``DataLoaderWatcher.current_batch``).
* A training forward (module in train mode, gradients on) whose ``hx`` is that state is
  judged: every tensor of it a view of the storage returned (``h.detach()``, ``h.data``, a
  slice) not changed in place since, or, on the CPU, equal to it in value
  (``h.detach().clone()``); and not all one value (a state reset in place, ``h.zero_()``,
  ``h.data.fill_(0)``). It was carried from the module's previous forward on another batch
  (a time-step loop within one batch, an encoder handing its state to a decoder, chunks of
  one batch: the same batch, nothing judged), both batches come from loaders that draw at
  random (``DataLoaderWatcher.draws_at_random``), and the state's batch dimension is a
  leading dimension of a tensor of the batch given now (its rows are that batch's samples: an
  unrelated shuffled loader read alongside a ``batchify`` stream says nothing). Then
  ``state_carried`` (an aside) is recorded once per line.

Where it points: the outermost user frame that holds the state given in a variable (the
training loop's ``out, hx = model(x, hx)``), else the module's call (``self.hidden`` kept on
the module: ``out, self.hidden = self.rnn(x, self.hidden)``).

Silent by construction: no DataLoader (RL environment steps, ``batchify`` streams), loaders
that serve in order or whose order is the script's own (a batch sampler of its own), a
state made anew per batch (``None``, zeros, ``init_hidden()``: new storage), unbatched
input. Skipped: threads other than the script's, torch.compile (the window closes before it
runs), tensors the hook cannot read (no storage).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Mapping
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .recorder import Recorder

WINDOW = 6  # backwards watched, from the first one
_TOLD = 4  # lines recorded at most
_MODULES = 64  # recurrent modules whose last state is kept at most
_BATCHES = 4  # served batches whose tensors' leading dimensions are kept
_FIELDS = 8  # tensors of a served batch read at most
_LOCALS = 256  # variables of a frame looked at, at most
_RECURRENT = (nn.RNNBase, nn.RNNCellBase)


def _state_tensors(state) -> list:
    """The tensors of a recurrent state: a tensor, or an LSTM's ``(h, c)``."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, (tuple, list)) and 0 < len(state) <= 2 \
            and all(isinstance(t, torch.Tensor) for t in state):
        return list(state)
    return []


def _returned_state(module, output) -> list:
    if isinstance(module, nn.RNNCellBase):
        return _state_tensors(output)
    if isinstance(output, (tuple, list)) and len(output) == 2:
        return _state_tensors(output[1])
    return []


def _given_state(args, kwargs) -> list:
    state = args[1] if len(args) > 1 else (kwargs or {}).get("hx")
    return _state_tensors(state) if state is not None else []


def _rows(module, state: torch.Tensor) -> int | None:
    """The batch dimension of a batched state, None for an unbatched one."""
    if isinstance(module, nn.RNNCellBase):
        return int(state.shape[0]) if state.dim() == 2 else None
    return int(state.shape[1]) if state.dim() == 3 else None


def _storage(t: torch.Tensor):
    try:
        return (t.device, t.untyped_storage().data_ptr())
    except Exception:  # a tensor without storage (a functorch wrapper, a meta tensor)
        return None


def _leading_dims(batch, depth: int = 0, found: set | None = None) -> set:
    """The first two dimensions of a served batch's tensors (nested at most twice)."""
    found = set() if found is None else found
    if isinstance(batch, torch.Tensor):
        found.update(int(d) for d in batch.shape[:2])
    elif depth < 2 and isinstance(batch, (tuple, list, Mapping)):
        items = batch.values() if isinstance(batch, Mapping) else batch
        for i, item in enumerate(items):
            if i >= _FIELDS:
                break
            _leading_dims(item, depth + 1, found)
    return found


class _Kept:
    """What a recurrent module returned at its latest forward: its state's tensors (detached
    aliases, which share the version counter), their storages and versions then."""

    __slots__ = ("ref", "batch", "tensors", "storages", "versions")

    def __init__(self, ref, batch, tensors: list):
        self.ref, self.batch, self.tensors = ref, batch, tensors
        self.storages = {_storage(t): t._version for t in tensors}
        self.storages.pop(None, None)


class StateCarryWatcher:
    def __init__(self, rec: Recorder, loader):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: current_batch, draws_at_random
        self.active = False
        self._handles: list = []
        self._backwards = 0
        self._kept: dict[int, _Kept] = {}  # id(module) -> its latest state
        self._served: dict[tuple, set] = {}  # (loader, epoch, index) -> leading dims of its tensors
        self._told: set = set()  # locations recorded

    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._kept, self._served = {}, {}

    # -- batches served ----------------------------------------------------------------------
    def served(self, loader: int, epoch: int, index: int, batch) -> None:
        """``BATCH_SERVED``: the leading dimensions of the batch's tensors, while watching."""
        if not self.active:
            return
        try:
            served = self._served
            served[(loader, epoch, index)] = _leading_dims(batch)
            while len(served) > _BATCHES:
                del served[next(iter(served))]
        except Exception as exc:
            self._stop()
            self.rec.internal_error("recurrent state carried (batch served)", exc)

    # -- the module hook ---------------------------------------------------------------------
    def _post(self, module, args, *rest):
        if not isinstance(module, _RECURRENT) or not self.active:
            return None  # hot path: every module call of the window
        rec = self.rec
        if get_ident() != rec.script_thread or (rec.running_backwards and rec.in_backward()):
            return None
        try:
            kwargs, output = rest if len(rest) == 2 else ({}, None)
            batch = self.loader.current_batch
            batch = tuple(batch) if batch is not None else None
            key = id(module)
            kept = self._kept.get(key)
            if kept is not None and kept.ref() is not module:
                kept = None
            if kept is not None and batch is not None and kept.batch is not None \
                    and kept.batch != batch and module.training and torch.is_grad_enabled():
                self._judge(module, args, kwargs, kept, batch)
            self._keep(module, key, batch, _returned_state(module, output))
        except Exception as exc:
            self._stop()
            rec.internal_error("recurrent state carried (forward)", exc)
        return None

    def _keep(self, module, key: int, batch, state: list) -> None:
        if not state:
            self._kept.pop(key, None)
            return
        if key not in self._kept and len(self._kept) >= _MODULES:
            return
        with torch.no_grad():
            tensors = [t.detach() for t in state]
        self._kept[key] = _Kept(weakref.ref(module), batch, tensors)

    def _judge(self, module, args, kwargs, kept: _Kept, batch: tuple) -> None:
        given = _given_state(args, kwargs)
        if not given:
            return
        shared = "storage"
        for t in given:
            storage = _storage(t)
            if storage in kept.storages:
                if _version_of(kept, storage) != kept.storages[storage]:
                    return  # changed in place since (``h.zero_()``: a reset in place)
                continue
            if not any(_same_values(t, k) for k in kept.tensors):
                return
            shared = "values"
        if _constant(given[0]):
            return  # all one value: a state reset to zeros (``h.data.zero_()`` moves no version)
        rows = _rows(module, given[0])
        dims = self._served.get(batch)
        if rows is None or dims is None or rows not in dims:
            return  # the state's rows are not known to be this batch's samples
        loader = self.loader
        sampler = loader.draws_at_random(batch[0])
        if sampler is None or loader.draws_at_random(kept.batch[0]) is None:
            return
        call = self.rec.here()
        loc = self._holder(given) or call
        if loc in self._told:
            return
        self._told.add(loc)
        self.rec.emit_aside(ev.state_carried(
            cls=type(module).__name__, loader=batch[0], sampler=sampler, batch=list(batch[1:]),
            previous=list(kept.batch[1:]), rows=rows, shared=shared,
            call=[call.path, call.line, call.function] if call is not None and call != loc else None),
            loc)
        if len(self._told) >= _TOLD:
            self._stop()

    def _holder(self, given: list):
        """The location of the outermost user frame with a variable that holds the state given
        (a tensor of it, or a tuple or list of them); None when no user frame does."""
        storages = {s for s in map(_storage, given) if s is not None}
        finder = self.rec.finder
        found = None
        for frame in finder.user_frames(sys._getframe(2)):
            if any(_holds(value, storages) for value in _first(frame.f_locals.values(), _LOCALS)):
                found = frame
        return finder.instruction_location(found) if found is not None else None

    # -- the window --------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if self.active:
            self._backwards += 1
            if self._backwards >= WINDOW:
                self._stop()
        return {}

    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._handles = register_module_hooks(patcher, post=self._post, classes=_RECURRENT)
        self.active = True


def _first(values, limit: int):
    for i, value in enumerate(values):
        if i >= limit:
            return
        yield value


def _holds(value, storages: set) -> bool:
    if isinstance(value, torch.Tensor):
        return _storage(value) in storages
    if isinstance(value, (tuple, list)) and 0 < len(value) <= 4:
        return any(isinstance(v, torch.Tensor) and _storage(v) in storages for v in value)
    return False


def _version_of(kept: _Kept, storage) -> int | None:
    return next((t._version for t in kept.tensors if _storage(t) == storage), None)


def _constant(t: torch.Tensor) -> bool:
    with torch.no_grad():
        flat = t.detach().reshape(-1)
        return flat.numel() > 0 and bool((flat == flat[0]).all())


def _same_values(given: torch.Tensor, kept: torch.Tensor) -> bool:
    """A copy of a state (``detach().clone()``), on the CPU: same shape, dtype and values, the
    values not all one number (a state of zeros says nothing of where it came from)."""
    if given.device.type != "cpu" or kept.device.type != "cpu" or given.shape != kept.shape \
            or given.dtype != kept.dtype or given.numel() < 2:
        return False
    with torch.no_grad():
        flat = kept.reshape(-1)
        if bool((flat == flat[0]).all()):
            return False
        return bool(torch.equal(given.detach(), kept))
