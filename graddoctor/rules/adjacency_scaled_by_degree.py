from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

_FORMS = {
    "sqrt": ("sqrt(deg_i * deg_j)", "D^1/2 (A + I) D^1/2: the exponent's minus is missing"),
    "row": ("deg_i, the degree of its row", "D (A + I): the rows multiplied by the degree, not divided"),
    "column": ("deg_j, the degree of its column", "(A + I) D: the columns multiplied by the degree, not divided"),
    "both": ("deg_i * deg_j", "D (A + I) D: both sides multiplied by the degree, not divided"),
}


class AdjacencyScaledByDegree(Rule):
    """
    ## What it does
    Finds a graph network's propagation matrix whose degree normalisation is inverted: the
    matrix a layer multiplies its node features by (`adj @ h`) holds on each edge `sqrt(d_i *
    d_j)` (`deg.pow(0.5)` where `deg.pow(-0.5)` was meant), `d_i` or `d_j` (the adjacency
    multiplied by the degree instead of divided), or `d_i * d_j`, with `d` each row's count of
    entries (its degree, the self-loop included). Read at the first 3 backwards of each
    backward line: the loss's graph is walked to its matrix products, and each square,
    non-negative CPU matrix without gradient of 8 rows or more that one of them multiplies by is
    compared with those forms, entry by entry, when the degrees differ. The same normalisation
    written over an edge list is read in the same walk: a dim-0 `index_add`/`scatter_add` whose
    messages are rows gathered at one end of each edge times a positive weight per edge without
    gradient (`out.index_add_(0, col, h[row] * norm[:, None])`), the degrees counted from the
    edge list. It points at the script's assignment that raises the degree to a power or
    multiplies by it, when it has one such assignment, else at the backward.

    ## Why is this bad?
    A GCN normalises the adjacency, `D^-1/2 (A + I) D^-1/2` (or `D^-1 (A + I)`, a mean), so that
    each edge's weight shrinks with the degrees of its two ends and every node's aggregate stays
    on the scale of its features. Inverted, a hub's aggregate is its degree (or more) times a
    leaf's, and the factor compounds layer after layer: the model's outputs follow the degrees
    more than the features, the features of low-degree nodes are drowned, and training is
    slower and worse. Nothing fails and the loss still falls.

    ## Example
    ```python
    deg = adj.sum(dim=1)
    d_inv_sqrt = deg.pow(0.5)
    adj_hat = d_inv_sqrt[:, None] * adj * d_inv_sqrt[None, :]
    ```

    ## Use instead
    ```python
    d_inv_sqrt = deg.pow(-0.5)
    ```

    ## Stays silent on
    `D^-1/2 (A + I) D^-1/2`, `D^-1 (A + I)` and `(A + I) D^-1`, and their edge-list forms
    (`dis[row] * dis[col]`, `1 / deg[col]`); edge weights that are data; a raw 0/1 adjacency (a sum
    aggregation, GIN's); a weighted adjacency (entries that are none of the degree forms); a
    graph whose nodes all have one degree (a regular graph: every form is one scale); matrices
    with negative entries (a Laplacian) or with gradient (attention weights); sparse matrices
    and matrices on an accelerator (not read). Not seen: a propagation applied to data without
    gradient (SGC's `P @ x` computed before the first layer: no product of the loss's graph).
    """

    code = "GD318"
    slug = "adjacency-scaled-by-degree"
    severity = Severity.WARNING
    summary = ("a graph's propagation matrix is scaled up by the node degrees instead of down: its "
               "degree normalisation is inverted")
    fix = "normalise by the inverse square root of the degrees: deg.pow(-0.5) on both sides"

    def check(self, a):
        for event in a.of_kind("degree_scaled"):
            loc = event.loc
            if loc is None:
                continue
            line = a.source.degree_power_line(loc.path)
            if line is not None:
                loc = Location(loc.path, line[0], loc.function)
            entry, what = _FORMS.get(event["form"], ("a degree form", "the normalisation inverted"))
            shown = f"`{line[1]}` makes " if line is not None else ""
            edges = event.get("edges") or 0
            made = (f"a propagation matrix ({event['nodes']}x{event['nodes']}, degrees up to "
                    f"{event['degree']})" if not edges else
                    f"the edge weights of a message-passing scatter ({edges} edges over "
                    f"{event['nodes']} nodes, degrees up to {event['degree']})")
            yield self.finding(
                f"{shown}{made} whose every edge weighs {entry}: {what}. Each node's aggregate "
                f"grows with the degrees around it, so hubs drown the other nodes' features "
                f"layer after layer",
                loc, fix=self.fix if event["form"] == "sqrt" else
                "divide by the degrees (D^-1/2 (A + I) D^-1/2, or D^-1 (A + I) for a mean) instead "
                "of multiplying by them",
                evidence={k: event.get(k) for k in ("form", "nodes", "degree", "edges")})
