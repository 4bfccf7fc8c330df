"""A graph's propagation matrix whose degree normalisation is inverted: messages scaled up by the
degrees instead of down.

A GCN aggregates ``adj_hat @ h`` with ``adj_hat = D^-1/2 (A + I) D^-1/2`` (or a mean, ``D^-1 (A +
I)``): each edge's weight shrinks with the degrees of its two ends, so a node's aggregate stays on
the scale of its features whatever its neighbourhood. Written ``deg.pow(0.5)`` (the minus of the
exponent dropped), ``deg[:, None] * adj`` (multiplied by the degree instead of divided) or
``deg.pow(1)``, each edge weighs ``sqrt(d_i d_j)``, ``d_i`` or ``d_i d_j``: a hub's aggregate is
its degree (or more) times larger than a leaf's, layer after layer, and the model learns from the
degrees more than from the features. Nothing fails and the loss falls.

How it is seen: at the first ``_LOOKED`` backwards of each backward line (``describe_loss``),
the loss's graph is walked (``_NODES`` nodes) for matrix products (``MmBackward0``) whose saved
left operand is a square, non-negative CPU matrix without gradient of ``_MIN_NODES`` rows or
more (a dense propagation matrix). Its pattern gives each row's count of entries ``d`` (the
degree, self-loop included); the entries are compared with ``sqrt(d_i d_j)``, ``d_i``, ``d_j`` and
``d_i d_j`` on every entry (relative ``_TOL``), when the degrees are not all the same. Any of
them is a ``degree_scaled`` aside event at the backward, once per matrix and backward line.
Weighted graphs (entries that are none of these), the right normalisations, raw 0/1 adjacencies
(a sum aggregation, GIN's) and matrices with negative entries (a Laplacian) read as nothing.

The same normalisation written over an edge list (``out.index_add_(0, col, h[row] * norm[:, None])``)
is read in the same walk: a dim-0 scatter (``index_add``, ``scatter_add``) whose message is a
product of rows gathered with one index (``h[row]``) and a positive weight per edge without
gradient (``norm``, one value per edge). The degrees are counted from the edge list itself (each
node's count in the scatter's index, then in the gather's: in- and out-degrees, the self-loops
the list holds included) and each edge's weight compared with the same four forms.

Cost: one graph walk per backward at the first backwards of each line only; per propagation
matrix found, a few reductions over its entries, once (CPU only, ``_MAX_CELLS`` at most).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .selfscatter import _message_input, _scatter_index, gathered_with
from .lossterms import PerLine, loss_roots
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 4096  # nodes of the loss's graph walked
_MIN_NODES = 8  # rows of a propagation matrix at least
_MAX_CELLS = 1 << 22  # a matrix larger than this is not read
_TOL = 1e-4  # relative difference of an entry from its degree form


def degree_form(m: torch.Tensor) -> tuple[str, int] | None:
    """``(form, largest degree)`` when the non-negative square matrix ``m`` holds on each entry
    ``(i, j)`` its degrees scaled up: ``"sqrt"`` ``sqrt(d_i d_j)``, ``"row"`` ``d_i``, ``"column"``
    ``d_j``, ``"both"`` ``d_i d_j`` (``d``: the count of entries of each row); None else."""
    if m.dim() != 2 or m.shape[0] != m.shape[1] or m.shape[0] < _MIN_NODES:
        return None
    m = m.detach().to(torch.float64)
    if bool((m < 0).any()):
        return None
    nz = m > 0
    d = nz.sum(1).to(torch.float64)
    if bool((d == 0).any()) or float(d.max()) == float(d.min()) or float(d.max()) < 2:
        return None
    rows, cols = nz.nonzero(as_tuple=True)
    v = m[rows, cols]
    di, dj = d[rows], d[cols]
    forms = (("sqrt", (di * dj).sqrt()), ("row", di), ("column", dj), ("both", di * dj))
    for name, expected in forms:
        if bool(((v - expected).abs() <= _TOL * expected).all()):
            return name, int(d.max())
    return None


def _edge_weight(message, edges: int) -> torch.Tensor | None:
    """The weight per edge without gradient that ``message`` (a product node) multiplies gathered
    rows by: a floating CPU tensor of ``edges`` values, shaped (E,) or (E, 1); None else."""
    if message is None or type(message).__name__ != "MulBackward0":
        return None
    for name in ("_saved_other", "_saved_self"):
        w = saved(message, name)
        if isinstance(w, torch.Tensor) and not w.requires_grad and w.device.type == "cpu" \
                and w.is_floating_point() and w.numel() == edges and w.dim() in (1, 2) \
                and w.shape[0] == edges:
            return w.detach().reshape(-1).to(torch.float64)
    return None


def edge_degree_form(weight: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> tuple[str, int] | None:
    """``(form, largest degree)`` when each edge ``src -> dst`` weighs its degrees scaled up (the
    forms of ``degree_form``, ``d`` counted in ``dst`` or in ``src``); None else."""
    if weight.numel() != dst.numel() or dst.numel() != src.numel() or bool((weight <= 0).any()):
        return None
    n = int(max(int(dst.max()), int(src.max()))) + 1
    if n < _MIN_NODES:
        return None
    for counted in (dst, src):
        d = torch.bincount(counted, minlength=n).to(torch.float64)
        di, dj = d[dst], d[src]
        if float(di.max()) == float(di.min()) or float(d.max()) < 2 or bool((di == 0).any()) \
                or bool((dj == 0).any()):
            continue
        forms = (("sqrt", (di * dj).sqrt()), ("row", di), ("column", dj), ("both", di * dj))
        for name, expected in forms:
            if bool(((weight - expected).abs() <= _TOL * expected).all()):
                return name, int(d.max())
    return None


class DegreeNormWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._judged: set = set()  # (data_ptr, shape) of the matrices judged
        self._told: set = set()  # backward lines told

    def describe_loss(self, tensors) -> dict:
        if self._lines.exhausted:
            return {}
        try:
            loc = self.rec.here()
            if loc not in self._told and self._lines.admit(loc):
                self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("degree_norm", exc)
        return {}

    def _judge(self, tensors, loc) -> None:
        stack, seen = list(loss_roots(tensors)), set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            stack.extend(child for child, _ in node.next_functions if child is not None)
            if type(node).__name__ in ("IndexAddBackward0", "ScatterAddBackward0"):
                if self._judge_edges(node, loc):
                    return
                continue
            if type(node).__name__ != "MmBackward0":
                continue
            m = saved(node, "_saved_self")
            if not isinstance(m, torch.Tensor) or m.requires_grad or m.device.type != "cpu" \
                    or m.layout != torch.strided or not m.is_floating_point() or m.dim() != 2 \
                    or m.numel() > _MAX_CELLS:
                continue
            key = (m.data_ptr(), tuple(m.shape))
            if key in self._judged:
                continue
            self._judged.add(key)
            found = degree_form(m)
            if found is None:
                continue
            self._told.add(loc)
            self.rec.emit_aside(ev.degree_scaled(form=found[0], nodes=int(m.shape[0]),
                                                 degree=found[1]), loc)
            return

    def _judge_edges(self, node, loc) -> bool:
        dst = _scatter_index(node)
        if dst is None or dst.dtype not in (torch.int64, torch.int32) or dst.numel() > _MAX_CELLS:
            return False
        message = _message_input(node)
        weight = _edge_weight(message, dst.numel())
        if weight is None:
            return False
        gathers = gathered_with(message)
        if not gathers or len(gathers) != 1 or gathers[0].shape != dst.shape:
            return False
        key = (weight.data_ptr(), dst.data_ptr(), int(dst.numel()))
        if key in self._judged:
            return False
        self._judged.add(key)
        dst64, src64 = dst.to(torch.int64), gathers[0].to(torch.int64)
        found = edge_degree_form(weight, dst64, src64)
        if found is None:
            return False
        self._told.add(loc)
        nodes = int(max(int(dst64.max()), int(src64.max()))) + 1
        self.rec.emit_aside(ev.degree_scaled(form=found[0], nodes=nodes, degree=found[1],
                                             edges=int(dst.numel())), loc)
        return True

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
