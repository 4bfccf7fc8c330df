"""Message passing whose messages go back to the nodes they came from: a scatter (``index_add``,
``scatter_add``, ``scatter_reduce``) over rows that were all gathered with the scatter's own
index.

A graph layer written by hand gathers each edge's source features and scatters them onto the
edge's target: ``out.index_add_(0, dst, x[src] * norm)``. Scattered with the index it was
gathered with (``index_add_(0, src, x[src] ...)``), every edge hands a node back a copy of its
own features: the aggregate of node ``i`` is its own row times a sum over its edges, no feature
crosses an edge and the "graph" network is a per-node MLP scaled by the degree. Nothing fails and
the loss still falls (on the node features alone).

How it is seen: at the first ``_LOOKED`` backwards of each backward line (``describe_loss``),
the loss's graph is walked (``_NODES`` nodes) for scatter nodes along dim 0 with a 1-D index
(``scatter_add``'s index expanded over the columns counts as its first column). Below each, the
message's graph is walked down every path to the first gather met (``x[idx]``,
``index_select(0, idx)``); the scatter is a fault only when every path ends at such a gather and
every gather's index holds the scatter's index, value for value (``_SAME_LIMIT`` entries at most
compared). A path that reaches a leaf, another scatter or anything else before a gather (a node's
own row added directly: GraphNorm's ``x - mean[batch]`` scattered by ``batch``; an edge feature;
attention from the other endpoint) reads as nothing. A fault makes a ``self_scatter`` aside at
the backward, once per backward line.

The same walk reads attention normalised over the wrong set: below a scatter's message (above its
row gathers), a softmax or log-softmax over dim 0 of a tensor with one row per edge. A graph
attention layer normalises each target's incoming edges (a segment softmax, made of ``exp`` and a
scatter of the sums); ``torch.softmax(e, dim=0)`` normalises over every edge of the batch, so a
node's weights sum to a sliver of 1 that shrinks with the graph's size. A scatter into two
targets or more with such a softmax is a ``softmax_over_edges`` aside, once per backward line.

The same walk reads a batch of graphs wired wrong: a scatter whose rows are not gathered and whose
index is sorted (a readout by the batch vector, ``index_add_(0, batch, x)``) names each node's
graph; the message-passing scatters' edges (gather index to scatter index, self-loops left out),
all numbered below the largest graph's node count (each graph's own numbering), then join nodes
of two graphs (``_ACROSS`` of them or more) or reach under ``1/_REACHED`` of the graphs: each
graph's edge index concatenated without adding the node count before it (a ``collate`` that
forgets the offset). Edges that reach node numbers past every graph's size are numbered over the
batch: one graph's clusters pooled apart, whose edges cross the clusters on purpose. An ``edges_across_graphs`` aside, once per backward line.

Cost: one graph walk per backward at the first backwards of each line only, plus two bounded walks
and one ``torch.equal`` per scatter found (CPU indices only).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossterms import PerLine, loss_roots
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 8192  # nodes of the loss's graph walked
_BELOW = 512  # nodes walked below one scatter's message
_SAME_LIMIT = 1 << 24  # index entries compared at most
_MIN_SEGMENTS = 2  # targets a scatter writes to, at least, for a softmax over all its rows to be wrong
_MIN_GRAPHS = 4  # graphs in a batch (and edges) for the edges' reach to be judged
_ACROSS = 0.2  # share of the edges joining two graphs, at least, to say the batch is miswired
_REACHED = 4  # or the edges reach fewer than 1/_REACHED of the batch's graphs
_SCATTERS = {"IndexAddBackward0": "index_add", "ScatterAddBackward0": "scatter_add",
             "ScatterReduceBackward0": "scatter_reduce"}


def _scatter_index(node) -> torch.Tensor | None:
    """The 1-D index a dim-0 scatter node wrote its rows at, or None."""
    if saved(node, "_saved_dim", None) not in (0,):
        return None
    index = saved(node, "_saved_index")
    if not isinstance(index, torch.Tensor) or index.device.type != "cpu" or index.numel() == 0:
        return None
    if index.dim() == 2:
        first = index[:, :1]
        if not bool((index == first).all()):
            return None
        index = first.reshape(-1)
    return index if index.dim() == 1 else None


def _message_input(node):
    """The autograd node of the rows a scatter node scattered (its source)."""
    nexts = node.next_functions
    if type(node).__name__ == "IndexAddBackward0":
        return nexts[1][0] if len(nexts) > 1 else None
    return nexts[-1][0] if nexts else None


def _gather_index(node) -> torch.Tensor | None:
    """The 1-D integer index of a row gather node (``x[idx]``, ``index_select(0, idx)``), or None
    for any other node."""
    name = type(node).__name__
    if name == "IndexBackward0":
        indices = saved(node, "_saved_indices")
        if not isinstance(indices, (tuple, list)) or len(indices) != 1:
            return None
        index = indices[0]
    elif name == "IndexSelectBackward0":
        if saved(node, "_saved_dim", None) != 0:
            return None
        index = saved(node, "_saved_index")
    else:
        return None
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.int64, torch.int32) \
            or index.device.type != "cpu":
        return None
    return index


def gathered_with(message) -> list[torch.Tensor] | None:
    """The indices of the gathers that every path below ``message`` ends at first, or None when
    a path ends anywhere else (a leaf, another scatter) or the walk is too long."""
    if message is None:
        return None
    found, stack, seen = [], [message], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > _BELOW:
            return None
        index = _gather_index(node)
        if index is not None:
            found.append(index)
            continue
        name = type(node).__name__
        if name in _SCATTERS or name == "AccumulateGrad" or not node.next_functions:
            return None
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found or None


def _edge_softmax(message, edges: int) -> str | None:
    """``"softmax"``/``"log_softmax"`` when, below ``message`` and above its row gathers and any
    other scatter, a (log-)softmax node normalised dim 0 of a result with ``edges`` rows; None
    else."""
    if message is None:
        return None
    stack, seen = [message], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > _BELOW:
            return None
        name = type(node).__name__
        if name in ("SoftmaxBackward0", "LogSoftmaxBackward0"):
            result = saved(node, "_saved_result")
            dim = saved(node, "_saved_dim", None)
            if isinstance(result, torch.Tensor) and isinstance(dim, int) and result.dim() >= 1 \
                    and dim % result.dim() == 0 and result.shape[0] == edges:
                return "softmax" if name == "SoftmaxBackward0" else "log_softmax"
            continue
        if _gather_index(node) is not None or name in _SCATTERS or name == "AccumulateGrad":
            continue
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return None


def _gathers_below(message) -> list[torch.Tensor]:
    """The indices of the first row gathers on the paths below ``message`` (paths ending at a
    leaf or another scatter are passed over: an attention weight's parameters)."""
    if message is None:
        return []
    found, stack, seen = [], [message], set()
    while stack and len(seen) <= _BELOW:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        index = _gather_index(node)
        if index is not None:
            if not any(index is f for f in found):
                found.append(index)
            continue
        if type(node).__name__ in _SCATTERS:
            continue
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.numel() > _SAME_LIMIT:
        return False
    return a is b or bool(torch.equal(a.to(torch.int64), b.to(torch.int64)))


class SelfScatterWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._told: set = set()  # backward lines told
        self._told_softmax: set = set()  # backward lines told of an edge softmax over all edges
        self._told_batch: set = set()  # backward lines told of edges across a batch's graphs

    def describe_loss(self, tensors) -> dict:
        if self._lines.exhausted:
            return {}
        try:
            loc = self.rec.here()
            if loc not in self._told and self._lines.admit(loc):
                self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("self_scatter", exc)
        return {}

    def _judge(self, tensors, loc) -> None:
        pools, passes = [], []  # (index) of pooling scatters; (src, dst) of message scatters
        try:
            self._walk(tensors, loc, pools, passes)
        finally:
            if loc not in self._told_batch and pools and passes:
                self._edges_across(pools, passes, loc)

    def _walk(self, tensors, loc, pools, passes) -> None:
        stack, seen = list(loss_roots(tensors)), set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            stack.extend(child for child, _ in node.next_functions if child is not None)
            op = _SCATTERS.get(type(node).__name__)
            if op is None:
                continue
            index = _scatter_index(node)
            if index is None:
                continue
            if loc not in self._told_softmax:
                self._softmax_across(node, index, loc)
            gathers = gathered_with(_message_input(node))
            below = _gathers_below(_message_input(node))
            if not below and index.numel() >= _MIN_SEGMENTS * 2 and len(pools) < 8:
                pools.append(index)  # rows scattered as they are: a readout by a batch vector?
            elif below and len(passes) < 16:
                passes.extend((g, index) for g in below if g.shape == index.shape)
            if not gathers or not all(_same(index, g) for g in gathers):
                continue
            self._told.add(loc)
            self.rec.emit_aside(ev.self_scatter(op=op, edges=int(index.numel()),
                                                nodes=int(index.unique().numel())), loc)
            return

    def _softmax_across(self, node, index: torch.Tensor, loc) -> None:
        """A softmax over dim 0 of the scattered rows' weights (one per edge) found below the
        message, above its gathers: attention normalised over every edge of the batch, not over
        each target's incoming edges."""
        edges = int(index.numel())
        found = _edge_softmax(_message_input(node), edges)
        if found is None:
            return
        segments = int(index.unique().numel())
        if segments < _MIN_SEGMENTS:
            return  # one target (a readout of one graph): over all rows is over its rows
        self._told_softmax.add(loc)
        self.rec.emit_aside(ev.softmax_over_edges(op=_SCATTERS[type(node).__name__], edges=edges,
                                                  targets=segments, fn=found), loc)

    def _edges_across(self, pools, passes, loc) -> None:
        """Message-passing edges that join nodes of different graphs of a batch: the batch vector
        is a pooling scatter's index (sorted, each graph's nodes in one run), the edges the
        gathers and scatters of the message-passing layers (self-loops left out)."""
        for batch in pools:
            b = batch.to(torch.int64)
            if b.dim() != 1 or bool((b[1:] < b[:-1]).any()):
                continue
            graphs = int(b.unique().numel())
            if graphs < _MIN_GRAPHS:
                continue
            n = int(b.numel())
            largest = int(torch.bincount(b - b.min()).max())  # nodes of the largest graph
            for src, dst in passes:
                s, d = src.to(torch.int64), dst.to(torch.int64)
                if int(s.max()) >= n or int(d.max()) >= n or int(s.min()) < 0 or int(d.min()) < 0:
                    continue
                if max(int(s.max()), int(d.max())) >= largest:
                    continue  # edges numbered past any one graph's nodes: the batch's numbering
                    # (clusters of one graph pooled apart, whose edges cross them on purpose)
                moved = s != d
                edges = int(moved.sum())
                if edges < _MIN_GRAPHS:
                    continue
                gs, gd = b[s[moved]], b[d[moved]]
                across = float((gs != gd).float().mean())
                reached = int(gd.unique().numel())
                if across < _ACROSS and reached * _REACHED > graphs:
                    continue
                self._told_batch.add(loc)
                self.rec.emit_aside(ev.edges_across_graphs(
                    graphs=graphs, nodes=n, edges=edges, across=round(across, 4),
                    reached=reached), loc)
                return

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
