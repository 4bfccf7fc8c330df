"""A piecewise-linear loss term that takes its negative side everywhere (loss-term-concave).

The pinball (quantile) loss of a residual ``e`` is ``q * e`` where ``e >= 0`` and ``(q - 1) * e``
where ``e < 0``: two lines of opposite sign, and the loss takes the one that is positive at
each element (``max(q * e, (q - 1) * e)``, ``e * (q - 1{e < 0})``). With ``q`` and ``q - 1``
swapped between the two sides, it takes the negative one everywhere: ``-|e|``-like, concave,
unbounded below, and minimising it pushes every prediction away from its target. The same
holds for any asymmetric absolute loss (an expectile's or a check function's weights) written
the other way round.

What is observed, in the forwards of the first ``_WINDOWS`` backwards only:

* ``torch.where(cond, a, b)`` (function and method) of two tensors with gradient, and
  ``torch.minimum`` / two-tensor ``torch.min``: where ``a`` and ``b`` have opposite signs at
  ``_OPPOSITE`` of the elements at least and the result is negative at ``_NEGATIVE`` of them
  (never positive at more than ``1 - _OPPOSITE``): a term that picks the negative of two
  opposite lines.
* A product (``*``, ``mul``) of a tensor with gradient and a tensor without, whose constant
  factor takes one or two values, one of them negative (``q - 1{e < 0}``: ``q`` and ``q - 1``;
  only one where every residual has one sign), and whose product is negative at
  ``_NEGATIVE`` of the elements (never positive at more than ``1 - _OPPOSITE``): sign-dependent
  weights whose signs are opposite to the residual's everywhere.

Each such result's autograd node is kept for the window; at the backward, the loss's linear top
is walked (``signed_walk``) and a kept node held with a positive sign (minimised) makes a
``concave_term`` aside at the call's line. CPU tensors of at most ``_ELEMENTS`` values; at most
``_CHECKS`` products checked per window. The wrappers are taken away after the windows.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import watched_call
from .lossterms import loss_root, signed_walk
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_WINDOWS = 3
_ELEMENTS = 1 << 20
_MIN_ELEMENTS = 8
_OPPOSITE = 0.95
_NEGATIVE = 0.6
_CHECKS = 2000  # products checked per window, at most
_KEPT = 32  # candidate terms kept per window
_WALK = 512  # nodes of the loss's linear top walked
_LABEL = "concave term"

_SELECTS = ((torch, "where", "where"), (torch.Tensor, "where", "where"),
            (torch, "minimum", "min"), (torch, "min", "min"), (torch.Tensor, "minimum", "min"))
_PRODUCTS = ((torch.Tensor, "__mul__"), (torch.Tensor, "__rmul__"), (torch.Tensor, "mul"),
             (torch, "mul"))


def _fit(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype.is_floating_point
            and _MIN_ELEMENTS <= t.numel() <= _ELEMENTS)


def _shares(values):
    """(share negative, share positive) of a tensor's elements."""
    n = values.numel()
    return float((values < 0).sum()) / n, float((values > 0).sum()) / n


class ConcaveTermWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._busy = False
        self._window = 0
        self._checks = 0
        self._kept: list = []  # (node, form, negative share, loc)
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        for owner, name, form in _SELECTS:
            self._wrap(patcher, owner, name, self._selected(form, name))
        for owner, name in _PRODUCTS:
            self._wrap(patcher, owner, name, self._product)
        close_before_compile(patcher, self._close)

    def _wrap(self, patcher, owner, name, after) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = watched_call(original, after)
        patcher.patch(owner, name, wrapper)
        self._restore.append((owner, name, original, wrapper))

    def _caller(self):
        caller = sys._getframe(3)
        while caller is not None and caller.f_code.co_filename.startswith("<graddoctor"):
            caller = caller.f_back
        if caller is None or not self.rec.finder.is_user_file(caller.f_code.co_filename):
            return None
        return self.rec.finder.location(caller)

    def _keep(self, result, form: str, negative: float) -> None:
        loc = self._caller()
        if loc is not None and len(self._kept) < _KEPT:
            self._kept.append((result.grad_fn, form, negative, loc))

    def _selected(self, form: str, name: str):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy or not _fit(result) or result.grad_fn is None:
                return
            if form == "where":
                if len(args) < 3:
                    return
                a, b = args[1], args[2]
            else:
                if len(args) != 2 or kwargs:
                    return
                a, b = args
            if not (_fit(a) and _fit(b) and a.requires_grad and b.requires_grad):
                return
            self._busy = True
            try:
                with torch.no_grad():
                    if a.shape != b.shape:
                        a, b = torch.broadcast_tensors(a, b)
                    opposite = float(((a * b) <= 0).sum()) / a.numel()
                    if opposite < _OPPOSITE:
                        return
                    negative, positive = _shares(result)
                if negative >= _NEGATIVE and positive <= 1 - _OPPOSITE:
                    self._keep(result, form, negative)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    def _product(self, args, kwargs, result) -> None:
        if not self._open or self._busy or len(args) != 2 or not _fit(result) or result.grad_fn is None:
            return
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        if a.requires_grad == b.requires_grad:
            return
        weights = b if a.requires_grad else a
        if not _fit(weights) or weights.numel() < _MIN_ELEMENTS or self._checks >= _CHECKS:
            return
        self._checks += 1
        self._busy = True
        try:
            with torch.no_grad():
                # a check function's weights: q and q - 1, one of them negative (a batch whose
                # residuals all have one sign, far from its targets at the start, shows one)
                if not bool((weights < 0).any()) or torch.unique(weights).numel() > 2:
                    return
                negative, positive = _shares(result)
            if negative >= _NEGATIVE and positive <= 1 - _OPPOSITE:
                self._keep(result, "weights", negative)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        finally:
            self._busy = False

    def describe_loss(self, tensors) -> dict:
        try:
            if not self._open:
                self._unwrap_or_retire()
                return {}
            self._window += 1
            kept, self._kept = self._kept, []
            self._checks = 0
            root = loss_root(tensors)
            if kept and root is not None:
                wanted = {node: (form, negative, loc) for node, form, negative, loc in kept}
                held: dict = {}

                def visit(node, sign, name, children) -> bool:
                    if node in wanted:
                        held[node] = sign if held.get(node, sign) == sign else 0.0
                        return True
                    return False

                signed_walk(root, _WALK, visit)
                for node, sign in held.items():
                    if sign > 0:
                        form, negative, loc = wanted[node]
                        self.rec.emit_aside(ev.concave_term(form=form, negative=round(negative, 4),
                                                            line=loc.line), loc)
            if self._window >= _WINDOWS:
                self._close()
        except Exception as exc:
            self._close()
            self.rec.internal_error(_LABEL, exc)
        return {}

    def _close(self) -> None:
        self._open = False
        self._kept = []
        self._unwrap()

    def _unwrap_or_retire(self) -> None:
        if self._restore:
            self._unwrap()
        if not self._restore:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)

    def _unwrap(self) -> None:
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper in restore:
            try:  # under another watcher's wrapper, left to it (retired: it skips this one)
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
