"""A weighted sum ``M @ H`` divided row by row by the sums of ``M``'s columns instead of its rows.

``(adj @ h) / deg`` is a mean over each node's neighbours when ``deg`` counts the entries of
each row of ``adj`` (the neighbours that row sums over): ``adj.sum(1)``, ``adj.sum(-1)``. With
``adj.sum(0)`` (``adj.sum(1)`` of a batched ``(B, N, N)`` adjacency) each node's sum is divided
by how many nodes aggregate *it*: on a directed graph (a citation graph, a kNN graph, a session
graph) every node's mean is scaled by an unrelated count, so hubs are shrunk or blown up, and
the loss still falls. The same for hand-normalised attention, ``(w @ v) / w.sum(-2)``: the
weights of a row no longer sum to one. On an undirected graph the two sums are the same and
either is right.

How it is seen: ``Tensor.__truediv__``, ``Tensor.div`` and ``torch.div`` are wrapped until the
first backwards (then put back: nothing of this runs in the updates). A division is judged when
its numerator is the result of a matrix product (``MmBackward0``, ``BmmBackward0``, through
``matmul``'s views) whose left operand ``M``, saved by the product, is square in its last two
dimensions and non-negative, and its denominator is laid out as one number per row of the
result (``(..., N, 1)``). It is reported when the two sums of ``M`` differ
(by ``DIFFER`` of the row sums' mean or more) and the denominator equals the column sums
wherever they are not zero (a ``clamp(min=1)`` or an ``eps`` on the empty ones allowed), on at
least ``LIVE`` of the rows. Only saved tensors that went through no saved-tensor hooks are read
(``graphpaths.saved``). One ``aggregate_sum`` aside event per call line (loc: the division).
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .graphpaths import saved
from .inlinable import watched
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_LABEL = "aggregate divided by a sum"
_PRODUCTS = {"MmBackward0": "mm", "BmmBackward0": "bmm"}
_VIEWS = {"UnsafeViewBackward0", "ViewBackward0", "ReshapeAliasBackward0"}
_DIVISIONS = ((torch.Tensor, "__truediv__"), (torch.Tensor, "div"), (torch, "div"))
CALLS = 64  # divisions by a per-row tensor judged in all
MAX_CELLS = 1 << 22  # a product's left operand larger than this is not read
DIFFER = 0.05  # the row and column sums differ by this share of the row sums' mean at least
LIVE = 0.5  # rows whose column sum is not zero, at least this share
TOLERANCE = 1e-3  # relative difference of the denominator from a column sum


def _left_operand(node):
    """The left operand a matrix product saved, when ``node`` is that product (through at most
    two views), and the product's name; else None."""
    for _ in range(3):
        name = type(node).__name__
        if name in _PRODUCTS:
            left = saved(node, "_saved_self")
            return (left, _PRODUCTS[name]) if isinstance(left, torch.Tensor) else None
        if name not in _VIEWS:
            return None
        children = [child for child, _ in node.next_functions if child is not None]
        if len(children) != 1:
            return None
        node = children[0]
    return None


def divided_by_columns(weights, denominator) -> dict | None:
    """For a product's square left operand ``weights`` (..., N, N) and the per-row
    ``denominator`` (..., N) its result was divided by: how far the row and column sums are
    apart, when the denominator is the column sums and they differ from the row sums; else None."""
    with torch.no_grad():
        m = weights.detach().double()
        d = denominator.detach().double()
        if bool((m < 0).any()):
            return None  # not weights
        rows, cols = m.sum(-1), m.sum(-2)
        scale = float(rows.abs().mean())
        if scale <= 0:
            return None
        differ = float((rows - cols).abs().mean()) / scale
        if differ < DIFFER:
            return None  # (nearly) symmetric: either sum is the row's
        live = cols > 1e-6 * scale
        if float(live.double().mean()) < LIVE:
            return None
        close = (d - cols).abs() <= TOLERANCE * cols.abs() + 1e-6 * scale
        if not bool(close[live].all()):
            return None
        return {"differ": round(differ, 4), "rows": int(m.shape[-1])}


class AggregateSumWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._calls = 0
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        for owner, name in _DIVISIONS:
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = watched(original, self._before)
            patcher.patch(owner, name, wrapper)
            self._restore.append((owner, name, original, wrapper))
        close_before_compile(patcher, self._close)

    def describe_loss(self, tensors) -> dict:
        self._close()
        return {}

    def _close(self) -> None:
        """Put torch's division back at the first backwards: nothing of this runs after it."""
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:
                put_back(owner, name, original, wrapper)  # not from under another's wrapper
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)

    def _before(self, args, kwargs) -> None:
        if not self._open or self._calls >= CALLS or len(args) < 2:
            return
        numerator, denominator = args[0], args[1]
        if not (isinstance(numerator, torch.Tensor) and isinstance(denominator, torch.Tensor)):
            return
        node = numerator.grad_fn
        if (node is None or numerator.dim() < 2
                or denominator.dim() != numerator.dim() or denominator.shape[-1] != 1
                or denominator.shape[:-1] != numerator.shape[:-1] or numerator.shape[-1] < 2):
            return
        try:
            found = _left_operand(node)
            if found is None:
                return
            left, op = found
            if (left.dim() != numerator.dim() or left.shape[-1] != left.shape[-2]
                    or left.shape[:-1] != numerator.shape[:-1] or left.numel() > MAX_CELLS
                    or left.is_complex() or not left.is_floating_point()):
                return
            self._calls += 1
            caller = sys._getframe(2)  # the code that divided
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            judged = divided_by_columns(left, denominator[..., 0])
            if judged is None:
                return
            loc = self.rec.here()
            if loc is None or (loc.path, loc.line) in self._told:
                return
            self._told.add((loc.path, loc.line))
            self.rec.emit_aside(ev.aggregate_sum(op=op, batched=left.dim() > 2, **judged), loc)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
