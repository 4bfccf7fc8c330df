"""A model whose forward writes into its own input, where that input is the script's data.

``x.sub_(mean).div_(std)`` inside ``forward`` changes the tensor it was given. When the batch
is a slice of a tensor the script keeps (``X[i:i + 32]``, a view) or the whole dataset itself
(``model(X)`` every step), the write lands in the data: the next epoch, or evaluation, reads
those rows normalised twice, and the model trains on inputs that drift. A fresh batch (a
DataLoader's collated copy) takes the same write harmlessly, so only inputs that share one
tensor across two model calls are told.

What is seen: global module hooks on every module call (removed with the window, the first
``WINDOW`` backwards) read the version counter of each tensor argument before and after the
call (a layer's input written by an in-place activation is a fresh tensor each call: never
told; a buffer of the model handed to a layer to update is its state, not data). A call that bumped it records the tensor's base (the tensor it is a view of, else itself)
by weak reference; a later call whose written input has the same base makes an
``input_written`` aside at the model's call, naming the forward and the argument written (once
per forward and argument: the source decides which writes matter, so one told does not end the
window). The
rule (rules/input_written_in_place.py) reads the forward's source for the arithmetic write
(``x.sub_``, ``x /= s``): assignments into an argument (a memory bank's ``queue[i] = k``) and
idempotent ones (``clamp_``, ``relu_``) are not this.

Cost: two hooks per module call in the window, a version read per tensor argument.
"""

from __future__ import annotations

import inspect
import weakref
from threading import get_ident

import torch

from .. import events as ev
from ..location import Location
from .dependency import close_before_compile, register_module_hooks
from .recorder import Recorder

WINDOW = 4  # backwards the hooks stay for
_BASES = 16  # bases of written inputs remembered


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter, or None where it keeps none (inference tensors, some
    subclasses): those are never the script's data read again."""
    if tensor.is_inference():
        return None
    try:
        return tensor._version
    except (RuntimeError, AttributeError, NotImplementedError):
        return None


def _parameter_names(module) -> list[str]:
    try:
        params = list(inspect.signature(type(module).forward).parameters)
    except (TypeError, ValueError):
        return []
    return params[1:]  # past self


class InputWriteWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._backwards = 0
        self._open: list = []  # per open module call: [(position, tensor, version)]
        self._outer = None  # the outermost module of the open calls (weak)
        self._bases: dict[int, weakref.ref] = {}  # id of a written input's base -> the base
        self._told: set = set()  # (forward's code, argument) told

    def install(self, patcher) -> None:
        # every module call, not only the outermost: a normalising layer inside nn.Sequential
        # is handed the data slice as it is
        self._handles = register_module_hooks(patcher, self._pre, self._post, with_kwargs=False)
        close_before_compile(patcher, self._stop)
        self.active = True

    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._open, self._bases = [], {}

    def describe_loss(self, tensors) -> dict:
        if self.active:
            self._backwards += 1
            if self._backwards >= WINDOW:
                self._stop()
        return {}

    def _pre(self, module, args):
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            if not self._open:
                self._outer = weakref.ref(module)
            self._open.append([(i, t, version) for i, t in enumerate(args)
                               if isinstance(t, torch.Tensor) and not t.requires_grad
                               and (version := _version(t)) is not None])
        except Exception as exc:
            self._stop()
            self.rec.internal_error("input write", exc)
        return None

    def _post(self, module, args, *rest):
        if not self.active or get_ident() != self.rec.script_thread or not self._open:
            return None
        try:
            for position, tensor, version in self._open.pop():
                if _version(tensor) != version:
                    self._written(module, position, tensor)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("input write", exc)
        return None

    def _written(self, module, position: int, tensor: torch.Tensor) -> None:
        base = tensor._base if tensor._base is not None else tensor
        outer = self._outer() if self._outer is not None else None
        if outer is not None and any(b is base or b is tensor for b in outer.buffers()):
            return  # a model's own state handed to a layer to update (running statistics)
        before = self._bases.get(id(base))
        if before is None or before() is not base:
            if len(self._bases) < _BASES:
                self._bases[id(base)] = weakref.ref(base)
            return
        forward = getattr(type(module).forward, "__code__", None)
        names = _parameter_names(module)
        if forward is None or position >= len(names) or \
                not self.rec.finder.is_user_file(forward.co_filename):
            return
        key = (forward, position)
        if key in self._told:
            return
        self._told.add(key)
        where = Location(self.rec.finder.display_path(forward.co_filename), forward.co_firstlineno,
                         "forward")
        self.rec.emit_aside(ev.input_written(
            module=type(module).__name__, argument=names[position],
            forward=[where.path, where.line], view=tensor._base is not None,
            rows=int(base.shape[0]) if base.dim() else 0,
            batch=int(tensor.shape[0]) if tensor.dim() else 0), self.rec.here())
