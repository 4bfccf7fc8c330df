from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class AttentionOverAllEdges(Rule):
    """
    ## What it does
    Finds graph attention normalised over every edge of the batch instead of over each target
    node's incoming edges: a dim-0 `index_add`, `scatter_add` or `scatter_reduce` of the loss's
    graph, writing to two targets or more, whose messages are weighed by a `softmax` (or
    `log_softmax`) taken over dim 0 of one value per edge (`torch.softmax(e, dim=0)`). Read at
    the first 3 backwards of each backward line: below each scatter's message, above its row
    gathers (`h[src]`), a softmax node whose normalised axis is the edges'. It points at the
    script's softmax call with dim 0 when the source has one, else at the backward. Attention
    pooling that normalises over all the nodes of a batch of graphs and scatters them by the
    batch vector is the same slip.

    ## Why is this bad?
    A graph attention layer (GAT, attention pooling) turns each target's incoming scores into
    weights that sum to 1 over that target's edges (a segment softmax: PyG's
    `softmax(alpha, index)`, or `exp` and a scatter of the sums). Over all edges, every node's
    weights sum to a sliver of 1 that shrinks as the graph grows, the nodes compete with
    unrelated ones across the graph for attention, and a node with few edges is drowned by the
    hubs. Nothing fails and the loss still falls, slower and to a worse model; the weights
    depend on the batch's size and composition.

    ## Example
    ```python
    e = F.leaky_relu((h[src] * a_src).sum(-1) + (h[dst] * a_dst).sum(-1))
    alpha = torch.softmax(e, dim=0)
    out = torch.zeros_like(h).index_add_(0, dst, h[src] * alpha[:, None])
    ```

    ## Use instead
    ```python
    e = e - torch.zeros(n).scatter_reduce(0, dst, e, "amax", include_self=False)[dst]
    w = e.exp()
    alpha = w / torch.zeros(n).index_add_(0, dst, w)[dst]   # a softmax over each dst's edges
    ```

    ## Stays silent on
    A segment softmax (exp and a scatter of the sums, `scatter_softmax`, PyG's `softmax`); a
    softmax over the heads or the features of each edge (dim 1 or -1 of an (E, H) tensor); a
    readout of one graph (every row scattered to one target, or no scatter: a softmax over all
    its nodes is over its own nodes); a softmax in an earlier layer (below the message's
    gathers). Not seen: attention normalised by hand over all edges (`w / w.sum()`), scatters
    on an accelerator, sparse attention (`torch.sparse.softmax`).
    """

    code = "GD342"
    slug = "attention-over-all-edges"
    severity = Severity.WARNING
    summary = ("graph attention is normalised over every edge of the batch instead of over each "
               "node's incoming edges: a softmax over dim 0 before a scatter")
    fix = ("normalise each target's incoming scores on their own: a segment softmax over the "
           "scatter's index (exp, then divide by the scattered sums; PyG's `softmax(e, dst)`)")

    def check(self, a):
        used: set = set()
        for event in a.of_kind("softmax_over_edges"):
            loc = event.loc
            if loc is None:
                continue
            calls = [c for c in a.source.softmax_first_axis_calls(loc.path) if (loc.path, c[0]) not in used]
            shown = "a softmax over dim 0"
            if len(calls) == 1:
                used.add((loc.path, calls[0][0]))
                shown = f"`{calls[0][1]}`"
                loc = Location(loc.path, calls[0][0], loc.function)
            yield self.finding(
                f"{shown} normalises one score per edge over all {event['edges']} edges, and "
                f"the weighed messages are then scattered ({event['op']}) to {event['targets']} "
                f"targets: each node's attention weights sum to a small share of 1 that shrinks "
                f"with the graph's size, instead of 1 over its own incoming edges",
                loc, fix=self.fix,
                evidence={k: event[k] for k in ("op", "edges", "targets", "fn")})
