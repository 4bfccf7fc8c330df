"""A regression target that gives each sample a value reduced over the batch
(``target-reduced-over-batch``): ``r + gamma * q_target(s2).max()`` (no ``dim``: one number for
the whole batch), ``.max(0)[0]`` (over the batch instead of the actions), an actor-critic's
``r + gamma * V(s2).mean()``.

The invariant: the side without gradient of a regression loss (``mse_loss``, ``smooth_l1_loss``,
``huber_loss``, ``l1_loss``, or a hand-written squared or absolute difference) holds, broadcast
back onto its samples, a reduction over dim 0 of a model's per-sample output — combined with
per-sample values that are not derived from that output (rewards, masks). A reduction combined
again with the values it was taken from is a normalisation (``(A - A.mean()) / A.std()``, a
batch-mean baseline) and says nothing.

How, and what it costs (first backwards only):

* Global module hooks see the outermost module calls of the script's thread (the dispatch
  counts the depth: the calls nested in them never reach this watcher); the output of an
  outermost call whose first dimension is its input's (the batch) gets a *lineage*: (a number
  per call, the batch size). A ``TorchFunctionMode`` follows the ops made between outermost
  module calls: put on the stack when one returns, taken off when the next one starts and at
  each backward (``DESCRIBE_LOSS``: the backward and the step make no target), for the first
  ``_WINDOWS`` backwards, at most ``_OPS`` ops a window (between two backwards); nothing is
  pushed inside a mode the script entered (its exit would pop ours). It reads shapes,
  ``requires_grad`` and the arguments, never a value. A torch function that dispatches to the
  mode does so by its public name, which may be graddoctor's wrapper of it (a loss function,
  ``Tensor.backward``, ``register_hook``): the mode calls the original instead
  (``torch_original``), so that no other watcher hears the call twice.
* Each op's outputs get the union of its tensor inputs' lineages. A reduction (``max``,
  ``mean``, ``sum``, ``logsumexp``, ... over dim 0 or over every dim) of a tensor whose first
  dimension is the batch of one of its lineages makes a *reduced* value (its op, dims, the
  reduced tensor's shape and lineages, the line). An op that combines a reduced value into an
  output whose first dimension is that batch makes the output *mixed*, unless a batch-shaped
  operand carries every lineage of the reduced tensor (a normalisation). Mixed values stay
  mixed through later ops.
* A regression loss call (``F.mse_loss`` ..., or an ``nn.MSELoss`` ... module called outside
  a module) with gradients on, one side needing a gradient and the other mixed
  and needing none, or a ``sub`` of such a pair that is then squared (``pow(2)``,
  ``square``, ``x * x``) or taken ``abs`` of, is a ``batch_reduced_target`` aside event at the
  reduction's line, once per line.

Not followed: ops inside a module's forward (a model's own batch statistics are
samples-mixed-in-batch's), targets computed in another thread, values that leave torch
(``.item()``, ``.tolist()``), a model that is no ``nn.Module`` (a function of weights), calls
after ``torch.compile`` (the window closes before it runs).
"""

from __future__ import annotations

import os
import threading
import weakref

import torch
from torch.nn.modules.loss import _Loss
from torch.overrides import TorchFunctionMode

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .follow import UninstallHandle, pop_mode, push_mode, remove_mode, script_mode_above, tensors_in, tensors_out
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_LABEL = "batch_reduced_target"
_WINDOWS = 6  # backwards whose targets are followed, from the first
_OPS = 50000  # ops followed in one window, at most
_TAGGED = 20000  # tensors carrying a lineage in one window, at most
_REDUCTIONS = frozenset({"max", "min", "amax", "amin", "mean", "nanmean", "sum", "nansum",
                         "logsumexp", "median", "nanmedian", "std", "var", "prod"})
_LOSSES = frozenset({"mse_loss", "smooth_l1_loss", "huber_loss", "l1_loss"})
# the nn loss modules whose forward is one of _LOSSES (called inside it, where nothing is followed)
_LOSS_MODULES = {"MSELoss": "mse_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
                 "L1Loss": "l1_loss"}
_SUBS = frozenset({"sub", "__sub__", "__rsub__", "rsub", "subtract"})
# calls that read a tensor's metadata, not its values
_METADATA = frozenset({"__get__", "data_ptr", "size", "dim", "ndimension", "numel", "nelement",
                       "stride", "storage_offset", "is_contiguous", "element_size",
                       "untyped_storage", "is_floating_point", "is_complex", "get_device",
                       "is_pinned", "__hash__", "__len__", "__bool__", "__format__", "item",
                       "tolist"})


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# torch's own Tensor methods, taken before any watcher wraps them (the wrappers keep no
# ``__wrapped__``)
_TENSOR_METHODS = {name: getattr(torch.Tensor, name)
                   for name in ("backward", "register_hook", "retain_grad", "requires_grad_")}


def _ours(func) -> bool:
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    path = code.co_filename
    return path.startswith("<graddoctor") or path.startswith(_PACKAGE + os.sep)


def torch_original(func):
    """The function torch dispatched: a torch function reached by the mode through its public
    name, which may be one of graddoctor's wrappers of it (a regression loss, ``backward``)
    whose original made the dispatch. Calling the wrapper again would tell every watcher of
    that call twice."""
    for _ in range(16):
        if not _ours(func):
            return func
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            return _TENSOR_METHODS.get(getattr(func, "__name__", None), func)
        func = inner
    return func


class _Mode(TorchFunctionMode):
    """Hands each call made outside the watcher's own work to ``watcher.follow`` while it is
    ``following``; a graddoctor wrapper torch dispatched to is called as the original it wraps."""

    def __init__(self, watcher):
        super().__init__()
        self.watcher = watcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = torch_original(func)(*args, **(kwargs or {}))
        watcher = self.watcher
        if watcher.following and getattr(func, "__name__", None) not in _METADATA:
            try:
                watcher.follow(func, args, kwargs, out)
            except Exception as exc:
                watcher.following = False
                watcher.rec.internal_error(_LABEL, exc)
        return out


class _Reduced:
    """A reduction over the batch axis: what it was, where, and what it reduced."""

    __slots__ = ("op", "dims", "batch", "shape", "lines", "loc")

    def __init__(self, op, dims, batch, shape, lines, loc):
        self.op, self.dims, self.batch, self.shape = op, dims, batch, shape
        self.lines, self.loc = lines, loc


class _Tag:
    __slots__ = ("lines", "reduced", "mixed")

    def __init__(self, lines: frozenset, reduced: _Reduced | None, mixed: _Reduced | None):
        self.lines, self.reduced, self.mixed = lines, reduced, mixed


def reduction_dims(name: str, x, args, kwargs):
    """The dims a reduction call reduces (``None``: every dim), or ``False`` when the call is
    no reduction (``torch.max(a, b)``, elementwise)."""
    kwargs = kwargs or {}
    if name in ("max", "min") and (isinstance(kwargs.get("other"), torch.Tensor)
                                   or (len(args) > 1 and isinstance(args[1], torch.Tensor))):
        return False
    dim = kwargs.get("dim", kwargs.get("axis"))
    if dim is None and len(args) > 1 and not isinstance(args[1], bool) \
            and isinstance(args[1], (int, tuple, list)):
        dim = args[1]
    if dim is None:
        return None
    if isinstance(dim, bool):
        return None
    if isinstance(dim, int):
        return (dim,)
    if isinstance(dim, (tuple, list)) and all(isinstance(d, int) for d in dim):
        return tuple(dim) if dim else None
    return False


def over_batch(dims, ndim: int) -> bool:
    """Whether reducing ``dims`` (``None``: all) of an ``ndim``-dim tensor reduces dim 0."""
    if ndim < 1:
        return False
    return dims is None or any(d % ndim == 0 for d in dims)


class BatchTargetWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.following = False
        self.closed = False
        self._mode: _Mode | None = None
        self._pushed = False  # the mode is on the followed thread's stack
        self._thread: int | None = None
        self._depth = 0  # outermost module calls running on the followed thread (0 or 1)
        self._windows = 0
        self._ops = 0
        self._calls = 0  # outermost module calls (lineage numbers)
        self._tags: dict = {}  # id(tensor) -> (weak tensor, _Tag)
        self._diffs: dict = {}  # id(difference) -> (weak difference, _Reduced)
        self._told: set = set()
        self._handles: list = []
        self._modes_below = 0  # the torch function modes entered before the run

    # -- tags ----------------------------------------------------------------------------------
    def _tag(self, tensor) -> _Tag | None:
        entry = self._tags.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return None

    def _set(self, tensor, tag: _Tag) -> None:
        if len(self._tags) < _TAGGED or id(tensor) in self._tags:
            self._tags[id(tensor)] = (weakref.ref(tensor), tag)

    # -- module hooks (outermost calls only: nothing inside a module's forward is followed) ------
    def _pre(self, module, args) -> None:
        if self.closed or self._windows >= _WINDOWS:
            return
        thread = threading.get_ident()
        if self._thread is None:
            self._thread = thread
        elif thread != self._thread:
            return
        if self._depth == 0:
            self._pop()  # nothing inside a module's forward is followed
        self._depth += 1

    def _post(self, module, args, *rest) -> None:
        if self.closed or threading.get_ident() != self._thread or self._depth <= 0:
            return
        self._depth -= 1
        if self._depth or self._windows >= _WINDOWS:
            return
        try:
            kwargs = rest[0] if len(rest) == 2 else {}
            fn = _LOSS_MODULES.get(type(module).__name__)
            if fn is not None and isinstance(module, _Loss):
                self._loss(fn, args, kwargs)
            elif self._ops <= _OPS:
                self._lineage(args, rest[-1] if rest else None)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        self._push()

    def _lineage(self, args, output) -> None:
        """The outputs of an outermost module call that lead with its input's batch get a
        lineage of their own."""
        first = next((t for t in tensors_in(args, {}) if t.dim() >= 1), None)
        if first is None:
            return
        batch = int(first.shape[0])
        if batch < 2:
            return
        self._calls += 1
        line = frozenset({(self._calls, batch)})
        for out in tensors_out(output):
            if out.dim() >= 1 and int(out.shape[0]) == batch:
                old = self._tag(out)
                self._set(out, _Tag(line | old.lines, old.reduced, old.mixed) if old else
                          _Tag(line, None, None))

    # -- the mode ------------------------------------------------------------------------------
    def follow(self, func, args, kwargs, out) -> None:
        if self._depth:
            return  # a module's forward (the mode could not be taken off the stack)
        self._ops += 1
        if self._ops > _OPS:
            self.following = False
            return
        name = getattr(func, "__name__", "")
        if name in _LOSSES:
            self._loss(name, args, kwargs)
            return
        inputs = [(t, tag) for t in tensors_in(args, kwargs) if (tag := self._tag(t)) is not None]
        if not inputs:
            return
        if name == "__setitem__":
            outs = [args[0]] if args and isinstance(args[0], torch.Tensor) else []
        else:
            outs = [t for t in tensors_out(out)]
        if not outs:
            return
        if name in _SUBS:
            self._difference(args, out)
        elif self._diffs:
            self._squared(name, args)
        if name in _REDUCTIONS and args and isinstance(args[0], torch.Tensor):
            reduced = self._reduction(name, args, kwargs)
            if reduced is not None:
                mine = self._tag(args[0])
                for t in outs:
                    self._set(t, _Tag(mine.lines, reduced, None))
                return
        lines = frozenset().union(*(tag.lines for _, tag in inputs))
        pending = [tag.reduced for _, tag in inputs if tag.reduced is not None]
        mixes = [tag.mixed for _, tag in inputs if tag.mixed is not None]
        for t in outs:
            batched = t.dim() >= 1
            mixed = mixes[0] if mixes and batched else None
            reduced = None
            for r in pending:
                if batched and int(t.shape[0]) == r.batch:
                    if mixed is None and not self._normalises(r, inputs):
                        mixed = r
                elif reduced is None:
                    reduced = r
            self._set(t, _Tag(lines, reduced, mixed))

    def _reduction(self, name, args, kwargs) -> _Reduced | None:
        x = args[0]
        tag = self._tag(x)
        if tag is None or not tag.lines or x.dim() < 1:
            return None
        batch = int(x.shape[0])
        if batch < 2 or not any(b == batch for _, b in tag.lines):
            return None
        dims = reduction_dims(name, x, args, kwargs)
        if dims is False or not over_batch(dims, x.dim()):
            return None
        lines = frozenset(line for line in tag.lines if line[1] == batch)
        return _Reduced(name, dims, batch, tuple(int(s) for s in x.shape), lines, self.rec.here())

    @staticmethod
    def _normalises(r: _Reduced, inputs) -> bool:
        """Whether a batch-shaped operand carries every lineage of the reduced tensor: the
        reduction is combined with the values it was taken from."""
        for t, tag in inputs:
            if t.dim() >= 1 and int(t.shape[0]) == r.batch and tag.lines >= r.lines:
                return True
        return False

    def _difference(self, args, out) -> None:
        pair = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(pair) != 2 or not isinstance(out, torch.Tensor) or out.dim() < 1:
            return
        found = self._target_of(*pair)
        if found is not None:
            self._diffs[id(out)] = (weakref.ref(out), found)

    def _squared(self, name, args) -> None:
        if not args or not isinstance(args[0], torch.Tensor):
            return
        entry = self._diffs.get(id(args[0]))
        if entry is None or entry[0]() is not args[0]:
            return
        if name in ("pow", "__pow__", "pow_") and len(args) > 1 and args[1] == 2 \
                or name in ("square", "abs", "absolute") \
                or name in ("mul", "__mul__") and len(args) > 1 and args[1] is args[0]:
            self._tell(entry[1], "hand-written squared error" if name != "abs" and name != "absolute"
                       else "hand-written absolute error")

    def _target_of(self, a, b) -> _Reduced | None:
        """The reduction mixed into whichever of ``a``, ``b`` is the target: it needs no gradient
        while the other does."""
        if not torch.is_grad_enabled():
            return None
        for pred, target in ((a, b), (b, a)):
            if pred.requires_grad and not target.requires_grad and target.dim() >= 1:
                tag = self._tag(target)
                if tag is not None and tag.mixed is not None:
                    return tag.mixed
        return None

    def _loss(self, name, args, kwargs) -> None:
        kwargs = kwargs or {}
        first = args[0] if args else kwargs.get("input")
        second = args[1] if len(args) > 1 else kwargs.get("target")
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
            found = self._target_of(first, second)
            if found is not None:
                self._tell(found, name)

    def _tell(self, r: _Reduced, fn: str) -> None:
        if r.loc is None or (r.loc.path, r.loc.line) in self._told:
            return
        self._told.add((r.loc.path, r.loc.line))
        loss = self.rec.here()
        self.rec.emit_aside(ev.batch_reduced_target(
            op=r.op, dims=list(r.dims) if r.dims is not None else None, batch=r.batch,
            shape=list(r.shape), fn=fn, loss_line=getattr(loss, "line", None)), r.loc)

    # -- windows -------------------------------------------------------------------------------
    def _push(self) -> None:
        """Put the mode on the stack (between module calls, until the backward)."""
        if self._pushed or self.closed or self._windows >= _WINDOWS \
                or script_mode_above(self._modes_below):
            return  # inside a mode the script entered: its exit would pop this one in its place
        if self._mode is None:
            self._mode = _Mode(self)
        if push_mode(self._mode, self.rec, _LABEL) is None:
            self.closed = True
            return
        self._pushed = True
        self.following = self._ops <= _OPS

    def _pop(self) -> None:
        if self._pushed and pop_mode(self._mode, self._thread, self.rec, _LABEL):
            self._pushed = False
        self.following = False

    def describe_loss(self, tensors) -> dict:
        if self._thread is None or threading.get_ident() != self._thread:
            return {}
        self._windows += 1
        if self._tags or self._diffs:
            self._tags, self._diffs = {}, {}
        self._ops = 0
        self._pop()  # the backward and the step make no target; the next forward puts it back
        if self._windows >= _WINDOWS:
            self._close()
        return {}

    def _close(self) -> None:
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)  # its windows are over: no call per step
        self.following = False
        self._tags, self._diffs = {}, {}
        self._pop()
        if self._pushed and remove_mode(self._mode, self._thread, self.rec, _LABEL):
            self._pushed = False  # another mode was entered above it: taken out from under it
        if not self._pushed:
            for handle in self._handles:
                try:
                    handle.remove()
                except Exception as exc:
                    self.rec.internal_error(_LABEL, exc)
            self._handles = []

    # -- install ---------------------------------------------------------------------------------
    def before_compile(self) -> None:
        # a graph traced with a mode on the stack, or global module hooks, would be traced too
        self.closed = True
        self._close()

    def install(self, patcher) -> None:
        self._modes_below = torch._C._len_torch_function_stack()  # modes under the run (--emulate-cuda)
        close_before_compile(patcher, self.before_compile)
        patcher.handle(UninstallHandle(self))
        self._handles = register_module_hooks(patcher, self._pre, self._post, outermost=True)

    def uninstall(self) -> None:
        self.closed = True
        self._close()
