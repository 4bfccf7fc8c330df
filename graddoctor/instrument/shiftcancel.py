"""A term added to every class alike before a softmax: it cancels (logit-shift-cancels).

``softmax``, ``log_softmax`` and ``cross_entropy`` are invariant to adding one value to every
class of a row: ``softmax(x + c) == softmax(x)`` whenever ``c`` is the same along the class axis.
A term built that way changes nothing, however large: an AM-softmax/CosFace margin subtracted
from every class's cosine instead of the target's (``s * (cos - m)``), a per-sample "bias" head
added to all the logits (its parameters get exactly zero gradient), a scalar bias parameter on
attention scores, a DINO teacher center averaged over the classes instead of the batch (each
row's center is its own constant). Nothing fails; the margin, the head, the center do nothing.

The invariant, over what the forward computes: an addition or subtraction whose one operand is
constant along the class axis of its result (a Python number, a tensor of size 1 along that
axis, or a tensor whose values repeat along it) while the other varies along it makes a
*shifted* value; products and quotients by factors also constant along that axis, further
additions and negations keep it shifted; a softmax, log_softmax or cross_entropy over that
axis of a shifted value is a ``shift_cancelled`` aside event, at the line that added the term.

Silent: a term that differs across classes (a margin on the target only, ``m * one_hot``;
class priors; an attention mask); a factor (a temperature); a term that normalises the value
it is subtracted from (its max, logsumexp, mean or min along that axis, or over the whole
tensor: a numerically stable softmax written out), which is a no-op on purpose; a constant term
smaller than ``_SMALL`` (an epsilon) or zero (a center not yet updated); a shifted value read by
a loss that is not shift-invariant (MSE, BCE with logits). A term that carries gradient is
reported whatever its value: its parameters get no gradient through it.

How, and what it costs: ``Tensor``'s ``+``/``-``/``*``/``/``, unary minus, ``add``/``sub``/
``mul``/``div`` (methods and ``torch.*``) are wrapped until ``_WINDOWS`` backwards have run,
then put back; ``softmax``/``log_softmax`` (``F.*``, ``torch.*`` and the methods) and
``F.cross_entropy`` are watched for as long (their wrapper then does nothing). Only calls from
the user's code make a shifted value; values are read (CPU tensors only, ``_VALUES`` elements
at most: a larger or device operand makes no shifted value) when a term could be one, never under saved-tensor hooks, and nothing the script
computes changes.
"""

from __future__ import annotations

import sys
import weakref

import torch
import torch.nn.functional as F

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import unwatch, watched, watched_call
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_WINDOWS = 3  # backwards after which the wrappers go
_MARKS = 4096  # shifted values held between two backwards, at most
_VALUES = 1 << 23  # elements read to tell whether a tensor repeats along an axis, or normalises it
_SMALL = 1e-3  # a constant term below this (an epsilon) is no margin
_LABEL = "logit shift"

_ADD, _SUB, _MUL, _DIV, _NEG = "add", "sub", "mul", "div", "neg"
_ARITHMETIC = (
    (torch.Tensor, "__add__", _ADD), (torch.Tensor, "__radd__", _ADD), (torch.Tensor, "__iadd__", _ADD),
    (torch.Tensor, "__sub__", _SUB), (torch.Tensor, "__rsub__", _SUB), (torch.Tensor, "__isub__", _SUB),
    (torch.Tensor, "add", _ADD), (torch.Tensor, "sub", _SUB), (torch, "add", _ADD), (torch, "sub", _SUB),
    (torch.Tensor, "__mul__", _MUL), (torch.Tensor, "__rmul__", _MUL), (torch.Tensor, "__imul__", _MUL),
    (torch.Tensor, "mul", _MUL), (torch, "mul", _MUL),
    (torch.Tensor, "__truediv__", _DIV), (torch.Tensor, "__itruediv__", _DIV),
    (torch.Tensor, "div", _DIV), (torch, "div", _DIV),
    (torch.Tensor, "__neg__", _NEG), (torch.Tensor, "neg", _NEG), (torch, "neg", _NEG),
)
_SOFTMAXES = ((F, "softmax", "softmax"), (F, "log_softmax", "log_softmax"),
              (torch, "softmax", "softmax"), (torch, "log_softmax", "log_softmax"),
              (torch.Tensor, "softmax", "softmax"), (torch.Tensor, "log_softmax", "log_softmax"),
              (F, "cross_entropy", "cross_entropy"))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Shift:
    """A value with a term constant along ``axes`` (negative axes of the value; None: every
    axis) added at ``loc``."""

    __slots__ = ("axes", "loc", "grad", "value", "scalar")

    def __init__(self, axes, loc, grad: bool, value: float | None, scalar: bool):
        self.axes, self.loc, self.grad, self.value = axes, loc, grad, value
        self.scalar = scalar  # one number for every row (a margin), else one per row


def _readable(tensor) -> bool:
    return (isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
            and tensor.is_floating_point() and tensor.numel() <= _VALUES
            and not getattr(tensor, "is_sparse", False) and tensor.layout == torch.strided)


def constant_along(term, ax: int, size: int) -> bool:
    """Whether ``term`` (an operand) is the same along negative axis ``ax`` of a result that is
    ``size`` long there: a number, a tensor without that axis or of size 1 along it, or a
    tensor whose values repeat along it (read only for a CPU tensor without gradient)."""
    if _number(term):
        return True
    if not isinstance(term, torch.Tensor):
        return False
    if term.dim() < -ax or term.shape[ax] == 1:
        return True
    if term.shape[ax] != size or term.requires_grad or not _readable(term):
        return False
    with torch.no_grad():
        first = term.narrow(term.dim() + ax, 0, 1)
        return bool(torch.equal(term, first.expand_as(term)))


def class_axes(result) -> tuple[int, ...]:
    """The axes of ``result`` a softmax or cross_entropy could take as classes: the last, and
    dim 1 of a (N, C, ...) tensor."""
    n = result.dim()
    return (-1,) if n < 3 else (-1, 1 - n)


def normalises(term, other, axes) -> bool:
    """Whether ``term`` is a reduction of ``other`` along one of ``axes`` or over all of it (its
    max, logsumexp, mean or min): subtracting it is a numerically stable softmax, or a
    centring, written out — a no-op on purpose."""
    if not _readable(other):
        return False
    with torch.no_grad():
        t = torch.as_tensor(term.detach() if isinstance(term, torch.Tensor) else term,
                            dtype=other.dtype)
        o = other.detach()
        refs = [o.amax(), o.amin(), o.mean()]
        for ax in axes:
            if o.dim() >= -ax and o.shape[ax] > 1:
                refs += [o.amax(ax, keepdim=True), o.logsumexp(ax, keepdim=True),
                         o.mean(ax, keepdim=True), o.amin(ax, keepdim=True)]
        for ref in refs:
            try:
                shape = torch.broadcast_shapes(t.shape, ref.shape)
            except RuntimeError:
                continue
            if torch.allclose(t.expand(shape), ref.expand(shape), rtol=1e-5, atol=1e-6):
                return True
    return False


def _magnitude(term) -> float | None:
    """The largest absolute value of a constant term (None: not read)."""
    if _number(term):
        return abs(float(term))
    if not _readable(term) and not (isinstance(term, torch.Tensor) and term.numel() == 1
                                    and term.device.type == "cpu"):
        return None
    with torch.no_grad():
        return float(term.detach().abs().amax()) if term.numel() else 0.0


class ShiftCancelWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._busy = False  # graddoctor's own arithmetic while judging: not followed
        self._windows = 0
        self._marks: dict = {}  # id(value) -> (weak value, _Shift)
        self._locs: dict = {}  # (id(code), line) -> the user's Location
        self._told: set = set()
        self._restore: list = []  # (owner, name, original, wrapper) put back when the windows end
        self._consumers: list = []  # (owner, name, original, wrapper, before): put back, or
        # the test taken out of the shared wrapper on top of it, then

    def install(self, patcher) -> None:
        for owner, name, kind in _ARITHMETIC:
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched_call(original, self._arith(kind)))
            self._restore.append((owner, name, original, wrapper))
        for owner, name, fn in _SOFTMAXES:
            original = getattr(owner, name, None)
            if original is not None:
                before = self._consumer(fn)
                wrapper = patcher.patch(owner, name, watched(original, before))
                self._consumers.append((owner, name, original, wrapper, before))
        close_before_compile(patcher, self._close)

    # -- the windows -----------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self._open:
            return {}
        self._windows += 1
        if self._windows >= _WINDOWS:
            self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._marks = {}
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)  # its windows are over: no call per step
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
        # the softmaxes' and cross_entropy's wrappers are shared with other watchers: this
        # watcher's test leaves them (a mixture of experts calls a router softmax per layer)
        for owner, name, original, wrapper, before in self._consumers:
            try:
                if not put_back(owner, name, original, wrapper):
                    unwatch(owner, name, before)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)

    # -- marks -----------------------------------------------------------------------------------
    def _mark_of(self, value) -> _Shift | None:
        entry = self._marks.get(id(value))
        if entry is not None and entry[0]() is value:
            return entry[1]
        return None

    def _keep(self, value, shift: _Shift) -> None:
        if len(self._marks) >= _MARKS:
            self._marks = {k: v for k, v in self._marks.items() if v[0]() is not None}
            if len(self._marks) >= _MARKS:
                return
        try:
            self._marks[id(value)] = (weakref.ref(value), shift)
        except TypeError:  # no weak reference to it
            pass

    def _here(self, frame):
        key = (id(frame.f_code), frame.f_lineno)
        loc = self._locs.get(key)
        if loc is None:
            loc = self._locs[key] = self.rec.here()
        return loc

    # -- arithmetic ------------------------------------------------------------------------------
    def _arith(self, kind: str):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy or not isinstance(result, torch.Tensor):
                return
            self._busy = True
            try:
                if kind in (_ADD, _SUB):
                    self._added(args, kwargs, result)
                elif self._marks:
                    self._carried(kind, args, kwargs, result)
            except Exception as exc:
                self._open = False
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    def _added(self, args, kwargs, result) -> None:
        if result.dim() == 0 or not result.is_floating_point() or len(args) < 1:
            return
        a = args[0]
        b = args[1] if len(args) > 1 else kwargs.get("other")
        if self._marks:
            for operand in (a, b):
                shift = self._mark_of(operand) if isinstance(operand, torch.Tensor) else None
                if shift is not None:
                    self._keep(result, shift)  # x - m + y still holds -m in every class
                    return
        alpha = kwargs.get("alpha", 1)
        if not _number(alpha) or alpha == 0:
            return
        caller = sys._getframe(3)  # after <- wrapper <- the code that added
        if not self.rec.finder.is_user_file(caller.f_code.co_filename):
            return
        for term, other in ((b, a), (a, b)):
            if not isinstance(other, torch.Tensor) or other.dim() == 0:
                continue
            axes = tuple(ax for ax in class_axes(result)
                         if result.shape[ax] > 1 and other.dim() >= -ax
                         and other.shape[ax] == result.shape[ax]
                         and constant_along(term, ax, result.shape[ax]))
            if not axes:
                continue
            grad = isinstance(term, torch.Tensor) and term.requires_grad and torch.is_grad_enabled()
            value = None
            if not grad:
                value = _magnitude(term)
                if value is None or value < _SMALL:
                    continue
            if not _readable(other) or (isinstance(term, torch.Tensor) and term.device.type != "cpu"):
                continue  # the normalisation test reads values: without it, nothing is said
            if normalises(term, other, axes):
                continue
            loc = self._here(caller)
            if loc is not None:
                scalar = _number(term) or term.numel() == 1
                self._keep(result, _Shift(axes, loc, grad, value, scalar))
            return

    def _carried(self, kind: str, args, kwargs, result) -> None:
        """A product, quotient or negation of a shifted value stays shifted along the axes its
        factor is constant along."""
        if not args:
            return
        a = args[0]
        b = args[1] if len(args) > 1 else kwargs.get("other")
        if kind == _NEG:
            pairs = ((a, None),)
        elif kind == _DIV:
            pairs = ((a, b),)  # a quotient by a shifted value is no shift
        else:
            pairs = ((a, b), (b, a))
        for value, factor in pairs:
            shift = self._mark_of(value) if isinstance(value, torch.Tensor) else None
            if shift is None:
                continue
            if factor is None:
                self._keep(result, shift)
                return
            axes = shift.axes if shift.axes is not None else class_axes(result)
            kept = tuple(ax for ax in axes if result.dim() >= -ax
                         and constant_along(factor, ax, result.shape[ax]))
            if kept:
                self._keep(result, _Shift(kept, shift.loc, shift.grad, shift.value, shift.scalar))
            return

    # -- the shift-invariant consumers --------------------------------------------------------------
    def _consumer(self, fn: str):
        def before(args, kwargs) -> None:
            if not self._open or not self._marks or self._busy:
                return
            try:
                self._consumed(fn, args, kwargs)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
        return before

    def _consumed(self, fn: str, args, kwargs) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return
        shift = self._mark_of(x)
        if shift is None:
            return
        if fn == "cross_entropy":
            dim = 1 if x.dim() >= 2 else 0
        else:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if not isinstance(dim, int) or isinstance(dim, bool):
                return
        ax = dim - x.dim() if dim >= 0 else dim
        if not -x.dim() <= ax < 0 or x.shape[ax] < 2:
            return
        if shift.axes is not None and ax not in shift.axes:
            return
        key = (shift.loc.path, shift.loc.line)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.shift_cancelled(consumer=fn, grad=shift.grad, value=shift.value,
                                               scalar=shift.scalar, classes=int(x.shape[ax])),
                            shift.loc)
