from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class MessagesSentBackToSource(Rule):
    """
    ## What it does
    Finds a graph layer that scatters its messages back to the nodes they were gathered from: a
    dim-0 `index_add`, `scatter_add` or `scatter_reduce` of the loss's graph whose every message
    row was gathered (`x[idx]`, `index_select(0, idx)`) with the scatter's own index, value for
    value. Read at the first 3 backwards of each backward line: the loss's graph is walked to its
    scatters, and below each, every path of the message down to its first gather. It points at
    the scatter call whose message gathers with the name of its own index, when the script has
    one such call, else at the backward.

    ## Why is this bad?
    Message passing gathers each edge's source features and adds them onto the edge's target
    (`out.index_add_(0, dst, x[src])`). Scattered with the gather's index, every edge hands a
    node a copy of its own features: node `i`'s aggregate is its own row times a sum over its
    edges, no feature crosses an edge, and the graph network is a per-node MLP whose outputs
    are scaled by the degree. Nothing fails and the loss still falls, on the node features
    alone: what the graph would have added is lost.

    ## Example
    ```python
    row, col = edge_index
    msg = x[row] * norm.unsqueeze(-1)
    out = torch.zeros_like(x).index_add_(0, row, msg)
    ```

    ## Use instead
    ```python
    out = torch.zeros_like(x).index_add_(0, col, msg)
    ```

    ## Stays silent on
    Messages gathered at one end of each edge and scattered to the other (GCN, GraphSAGE's sum
    or mean, `scatter_reduce`); attention weights computed from both ends (GAT: a path reaches a
    gather with the other index); a node's own row added directly before the scatter
    (GraphNorm's `x - mean[batch]` scattered by `batch`); pooling by a batch vector (no gather);
    degrees counted with `index_add_` over ones (no gradient); edge features (a path with no
    gather); a mixture of experts' dispatch (tokens gathered by `top_x`, run through an expert
    and added back at `top_x`: the expert's weights lie on the path); sparse and dense adjacency
    products (no scatter). Not seen: messages put through a layer with parameters after the
    gather (`lin(x[src])` scattered to `src`), scatters on an accelerator or over other dims,
    indices kept only under saved-tensor hooks.
    """

    code = "GD286"
    slug = "messages-sent-back-to-source"
    severity = Severity.WARNING
    summary = ("a graph layer scatters each message back to the node it was gathered from: no "
               "feature crosses an edge")
    fix = ("scatter each message to its edge's other end: gather with one row of the edge index "
           "and scatter with the other (`x[src]` into `index_add_(0, dst, ...)`)")

    def check(self, a):
        for event in a.of_kind("self_scatter"):
            loc = event.loc
            if loc is None:
                continue
            line = a.source.self_scatter_line(loc.path)
            if line is not None:
                loc = Location(loc.path, line[0], loc.function)
            shown = f"`{line[1]}`" if line is not None else f"a `{event['op']}`"
            yield self.finding(
                f"{shown} scatters {event['edges']} messages onto {event['nodes']} nodes with the "
                f"same index their rows were gathered with: every edge hands a node back a copy "
                f"of its own features, so no feature crosses an edge and the layer is a per-node "
                f"map scaled by the degree",
                loc, fix=self.fix, evidence={k: event[k] for k in ("op", "edges", "nodes")})
