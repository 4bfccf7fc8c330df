"""State dicts that are no copies: ``best = model.state_dict()`` (or ``{k: v for k, v in
model.state_dict().items()}``, ``dict(...)``, ``.copy()``) holds the very tensors ``state_dict()``
returned, and those share storage with the live parameters: the "snapshot" follows every update,
so restoring it later (``load_state_dict``) or saving it (``torch.save``) gives the current
weights, not those of the moment it was taken.

``Module.state_dict`` is wrapped at its outermost call (it calls itself on every submodule; a
call with ``keep_vars=True``, which returns the parameters themselves, is left alone): each
tensor it returns is remembered by a weak reference keyed by its id, together with what it was
taken from (the module, weakly), the user's line and each optimizer's step count at that moment.
Nothing is kept alive; an entry goes when its tensor dies. ``torch.save`` is wrapped too, and
``load_state_dict``'s wrapper (the reset watcher's, instrument/resets.py: one wrapper per method)
tells this watcher of every state about to be loaded (``STATE_LOADED``). There the given object's
tensors (a state dict, or a checkpoint dict holding one) are looked up: those that are the very
tensors of an earlier ``state_dict()`` call and still share storage with a parameter or buffer of
the module it was called on, whose optimizers stepped since, make a ``snapshot_alias`` aside at
the user's call (rules/snapshot_aliases_params.py). A copy (``copy.deepcopy``, ``.clone()``, a
``torch.load``) is another tensor: never looked up as a snapshot.

A snapshot restored only after the loop (early stopping's ``model.load_state_dict(best_state)``)
is never reached in a check that stops after a few steps. So for the first ``HELD`` outermost
``state_dict()`` calls, the user's frame that made the call is kept until the next optimizer step
(``STEPPED``, subscribed only while one is pending); there its variables are read for a mapping
whose first value is the first tensor that call returned (the dict itself, or a copy of the dict
that holds the same tensors). One found, never given to ``load_state_dict``/``torch.save`` before
that step, and still sharing storage with a stepped parameter, makes a ``snapshot_held`` aside
with the variable's name at the ``state_dict()`` call: the rule reads in the script whether that
name is restored or saved later, and whether it is taken only on some iterations (in an ``if``).
A dict no variable of its caller holds is looked for among the items of the lists and tuples
held by the variables of the step's own stack (``states.append(client.state_dict())`` in the
caller of the function that returned it): found beside another item that is a state dict of the
same live tensors, the aside says how many (``alike``): snapshots that are all one model's
current weights.

Cost: nothing per step; per ``state_dict()`` call a weak reference per tensor; per load or save
a dict lookup per tensor, and a pass over the module's parameters only when one of them is a
snapshot taken before an optimizer step. For the first ``HELD`` calls, one read of the calling
frame's variables at the next step (and, when none holds the dict, of the lists and tuples held by
the variables of that step's stack, ``_FRAMES_READ`` frames).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Mapping

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import STATE_TAKEN, STEPPED

MAX_ITEMS = 100_000  # items of a saved object looked at (torch.save of a whole dataset)
MAX_DEPTH = 3  # {"model": state_dict, ...}, [state_dict, ...]: how deep a saved object is read
HELD = 8  # state_dict() calls whose result is looked for among the caller's variables
_NAMES_READ = 2000  # variables of a frame read, at most
_FRAMES_READ = 8  # frames of the step's stack whose lists are looked through for a snapshot
_ITEMS_READ = 256  # items of such a list looked at


class _Taken:
    """One ``state_dict()`` call: the module it was called on (weakly), the user's line and the
    optimizers' step counts at that moment."""

    __slots__ = ("module", "loc", "opt_steps", "used")

    def __init__(self, module, loc, opt_steps: dict[int, int]):
        self.module = weakref.ref(module)
        self.loc = loc
        self.opt_steps = opt_steps
        self.used = False  # given to load_state_dict / torch.save


class _Ref(weakref.ref):
    """A weak reference to one tensor a ``state_dict()`` call returned, with its key in the
    watcher's table and the call it came from."""

    __slots__ = ("key", "taken")


def _storage(tensor) -> int | None:
    """The address of the storage a tensor views (None when it has none to compare)."""
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except Exception:  # sparse, a wrapper subclass without storage
        return None
    return ptr or None  # 0: meta, or no elements


class SnapshotWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._local = threading.local()  # ``inside``: within an outermost state_dict() call
        self._refs: dict[int, _Ref] = {}  # id of a tensor state_dict() returned -> its reference
        self._taken = rec.subscribers(STATE_TAKEN)  # told of each outermost state_dict() call
        self._held_left = HELD
        self._pending: list = []  # [(user frame, _Taken, id of its first tensor)] until a step
        self._stepping = False  # called on STEPPED (only while a call is pending)
        self._subscribed = False

    # -- state_dict(): remember what it returned ------------------------------------------
    def _forget(self, ref: _Ref) -> None:
        refs = self._refs
        if refs.get(ref.key) is ref:
            del refs[ref.key]

    def _remember(self, module, result) -> None:
        if not isinstance(result, Mapping):
            return
        tensors = [v for v in result.values() if isinstance(v, torch.Tensor)]
        if not tensors:
            return
        rec = self.rec
        taken = _Taken(module, rec.here(3), dict(rec.progress.opt_steps))
        refs, forget = self._refs, self._forget
        for tensor in tensors:
            ref = _Ref(tensor, forget)
            ref.key, ref.taken = id(tensor), taken
            refs[ref.key] = ref
        if self._held_left > 0 and taken.loc is not None:
            frame = next(iter(rec.finder.user_frames(sys._getframe(2))), None)
            if frame is not None:
                self._held_left -= 1
                self._pending.append((frame, taken, id(tensors[0])))
                if not self._stepping:
                    self._stepping = True
                    if self._subscribed:
                        rec.resume(STEPPED, self.after_step)
                    else:
                        self._subscribed = True
                        rec.subscribe(STEPPED, self.after_step)

    # -- the next step: the snapshot still held by a variable of its caller ---------------------
    def after_step(self, opt, optimizer) -> None:
        pending, self._pending = self._pending, []
        self._stepping = False
        self.rec.retire(STEPPED, self.after_step)
        try:
            for frame, taken, key in pending:
                ref = self._refs.get(key)
                tensor = ref() if ref is not None and ref.taken is taken else None
                if tensor is None or taken.used:
                    continue
                held = _holder(frame, tensor)
                if held is not None:
                    tensors = [v for v in held[1].values() if isinstance(v, torch.Tensor)]
                    self._judge(taken, tensors, len(tensors), "held", held[0])
                    continue
                collected = _collection(self.rec.finder.user_frames(sys._getframe(1)), tensor)
                if collected is not None:
                    name, mapping, alike = collected
                    tensors = [v for v in mapping.values() if isinstance(v, torch.Tensor)]
                    self._judge(taken, tensors, len(tensors), "held", name, alike)
        except Exception as exc:
            self.rec.internal_error("snapshot held", exc)

    def _wrap_state_dict(self, original):
        watcher, rec, local = self, self.rec, self._local

        @functools.wraps(original)
        def state_dict(module, *args, **kwargs):
            if getattr(local, "inside", False):  # a submodule's, within the outermost call
                return original(module, *args, **kwargs)
            local.inside = True
            try:
                result = original(module, *args, **kwargs)
            finally:
                local.inside = False
            try:
                if not kwargs.get("keep_vars", args[2] if len(args) > 2 else False):
                    watcher._remember(module, result)
                    for taken in watcher._taken.now:
                        taken(module)
            except Exception as exc:
                rec.internal_error("Module.state_dict", exc)
            return result

        return state_dict

    # -- load_state_dict() / torch.save(): look the given tensors up ---------------------------
    def loading(self, module, state_dict) -> None:
        """``STATE_LOADED``: ``state_dict`` is about to be loaded into ``module``."""
        if self._refs:
            self._check(state_dict, "load_state_dict")

    def _wrap_save(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def save(obj, *args, **kwargs):
            if watcher._refs:
                try:
                    watcher._check(obj, "torch.save")
                except Exception as exc:
                    rec.internal_error("torch.save", exc)
            return original(obj, *args, **kwargs)

        return save

    def _check(self, obj, via: str) -> None:
        refs = self._refs
        found: dict[_Taken, list] = {}  # the state_dict() call -> its tensors given here
        total = 0
        for tensor in _tensors(obj):
            total += 1
            ref = refs.get(id(tensor))
            if ref is not None and ref() is tensor:
                found.setdefault(ref.taken, []).append(tensor)
        for taken, tensors in found.items():
            self._judge(taken, tensors, total, via)

    def _judge(self, taken: _Taken, tensors: list, total: int, via: str, name: str | None = None,
               alike: int | None = None) -> None:
        rec = self.rec
        if via != "held":
            taken.used = True
        module = taken.module()
        if module is None or rec.progress.opt_steps == taken.opt_steps:  # no step since
            return
        live = {}
        for param in module.parameters():
            ptr = _storage(param)
            if ptr is not None:
                live[ptr] = param
        buffers = {_storage(b) for b in module.buffers()}
        aliased, params = 0, set()
        for tensor in tensors:
            ptr = _storage(tensor)
            if ptr is None:
                continue
            param = live.get(ptr)
            if param is not None:
                aliased += 1
                pid = rec.pid(param)
                if pid is not None:
                    params.add(pid)
            elif ptr in buffers:
                aliased += 1
        if not params:
            return
        now, then = rec.progress.opt_steps, taken.opt_steps
        owned: set[int] = set()
        steps = 0
        for opt, pids in list(rec.opt_params.items()):
            mine = params.intersection(pids)
            if mine:
                owned |= mine
                steps += now.get(opt, 0) - then.get(opt, 0)
        if steps <= 0:
            return
        loc = taken.loc
        if via == "held":
            rec.emit_aside(ev.snapshot_held(name=name, params=sorted(owned), steps=steps, alike=alike), loc)
            return
        rec.emit_aside(ev.snapshot_alias(
            via=via, taken=None if loc is None else [loc.path, loc.line, loc.function],
            params=sorted(owned), tensors=aliased, total=total, steps=steps), rec.here(3))

    def install(self, patcher) -> None:
        patcher.patch(torch.nn.Module, "state_dict",
                      self._wrap_state_dict(torch.nn.Module.state_dict))
        patcher.patch(torch, "save", self._wrap_save(torch.save))


def _holder(frame, tensor) -> tuple[str, Mapping] | None:
    """A variable of ``frame`` holding a mapping whose first value is ``tensor``: its name and
    the mapping."""
    for i, (name, value) in enumerate(list(frame.f_locals.items())):
        if i >= _NAMES_READ:
            break
        if isinstance(value, Mapping) and value:
            try:
                first = next(iter(value.values()))
            except Exception:
                continue
            if first is tensor:
                return name, value
    return None


def _collection(frames, tensor) -> tuple[str, Mapping, int] | None:
    """A list or tuple held by a variable of one of ``frames`` (the step's stack, innermost
    first, ``_FRAMES_READ`` of them) among whose items is the dict whose first value is
    ``tensor``, with two items or more that are state dicts sharing that tensor's storage: its
    name, the dict, and how many such items it holds (``states.append(model.state_dict())`` of
    one model, round after round or client after client)."""
    ptr = _storage(tensor)
    if ptr is None:
        return None
    for n, frame in enumerate(frames):
        if n >= _FRAMES_READ:
            break
        for i, (name, value) in enumerate(list(frame.f_locals.items())):
            if i >= _NAMES_READ:
                break
            if not isinstance(value, (list, tuple)) or len(value) < 2:
                continue
            mine, alike = None, 0
            for item in value[:_ITEMS_READ]:
                if not isinstance(item, Mapping) or not item:
                    continue
                try:
                    first = next(iter(item.values()))
                except Exception:
                    continue
                if first is tensor:
                    mine = item
                if isinstance(first, torch.Tensor) and _storage(first) == ptr:
                    alike += 1
            if mine is not None and alike >= 2:
                return name, mine, alike
    return None


def _tensors(obj):
    """The tensors of a state dict, or of a checkpoint holding state dicts (``{"model": ...,
    "epoch": 3}``, a list of them), at most ``MAX_DEPTH`` containers deep and ``MAX_ITEMS``
    items read."""
    budget = MAX_ITEMS
    stack = [(obj, MAX_DEPTH)]
    while stack and budget > 0:
        item, depth = stack.pop()
        budget -= 1
        if isinstance(item, torch.Tensor):
            yield item
        elif depth > 0:
            if isinstance(item, Mapping):
                stack.extend((v, depth - 1) for v in reversed(list(item.values())[:budget]))
            elif isinstance(item, (list, tuple)):
                stack.extend((v, depth - 1) for v in reversed(item[:budget]))
