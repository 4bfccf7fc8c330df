from __future__ import annotations

import re
from dataclasses import replace

from ..findings import Related, Severity
from .base import Rule

# the denominator of a division written as a bare name (``/ deg``), not a call or an attribute
_SUMMED = re.compile(r"([A-Za-z_]\w*)\s*\.\s*sum\s*\(")
_DIVISOR = re.compile(r"/\s*([A-Za-z_]\w*)\b(?!\s*[\(\[\.\w])")


class AggregateDividedByColumnSums(Rule):
    """
    ## What it does
    Finds a weighted sum `M @ H` divided row by row by the sums of `M`'s columns instead of its
    rows: a mean over each node's neighbours `(adj @ h) / adj.sum(0)` on a directed graph (a
    GraphSAGE-mean or GIN-mean layer, a kNN or citation graph), `torch.bmm(adj, h) /
    adj.sum(1)` on a batch of `(B, N, N)` adjacencies, hand-normalised attention `(w @ v) /
    w.sum(-2)`. Reported when the two sums of `M` differ and the denominator is the column
    sums.

    ## Why is this bad?
    Row `i` of `M @ H` sums `H` over the entries of row `i` of `M`; a mean divides it by that
    row's total. The column sum of `i` counts something else: how many rows use node `i` (its
    out-degree where the row holds its in-neighbours). Every node's aggregate is scaled by an
    unrelated number (a node many others point to has its own neighbourhood shrunk; a node no
    one points to keeps a sum, not a mean), so features of very different sizes reach the next
    layer. Nothing fails and the loss still falls.

    ## Example
    ```python
    deg = adj.sum(dim=0).clamp(min=1).view(-1, 1)   # column sums
    agg = (adj @ h) / deg
    ```

    ## Use instead
    ```python
    deg = adj.sum(dim=-1, keepdim=True).clamp(min=1)   # the entries each row sums over
    agg = (adj @ h) / deg
    ```

    ## Stays silent on
    The row sums (`adj.sum(-1)`, with `clamp(min=1)` or an `eps`); an undirected (symmetric)
    graph, whose column sums are its row sums; a matrix normalised before the product
    (`P = A / A.sum(0)`, PageRank's column-stochastic convention, or the symmetric GCN
    normalisation); a rectangular `M` (user-item ratings: the other sum has another length);
    negative weights. Not judged: divisions after the first backwards, products through sparse
    tensors or `einsum` layouts other than `matmul`/`mm`/`bmm`, a left operand kept under
    saved-tensor hooks.
    """

    code = "GD269"
    slug = "aggregate-divided-by-column-sums"
    severity = Severity.WARNING
    summary = ("a product M @ H is divided row by row by the sums of M's columns instead of its "
               "rows: each row's mean is scaled by an unrelated count")
    fix = "divide by the sums over the axis the product sums: M.sum(-1, keepdim=True)"

    def check(self, a):
        for e in a.of_kind("aggregate_sum"):
            loc, related = e.loc, ()
            origin = self._denominator_origin(a, loc)
            text = origin[1] if origin is not None else (
                a.source.line_text(loc.path, loc.line) if loc is not None else "")
            summed = _SUMMED.search(text.split("#")[0])
            name = summed.group(1) if summed is not None else "M"
            product = f"torch.bmm({name}, ...)" if e["op"] == "bmm" else f"{name} @ ..."
            why = (f"the product sums each row of {name} ({e['rows']} columns), and a mean divides "
                   f"that row by its own total; the matching column's sum counts how often that "
                   f"row's node is used by the others (the two sums differ by {e['differ']:.0%} on "
                   "average: a directed graph or unnormalised weights). Each row's aggregate is "
                   "scaled by an unrelated count, so it is no mean")
            if origin is not None:  # the sum is taken on a line of its own: the line to change
                related = (Related(loc, "the division by it"),)
                what = (f"this sums {name} over its columns, and line {loc.line} divides each row "
                        f"of {product} by it: {why}")
                loc = replace(loc, line=origin[0])
            else:
                what = (f"this divides each row of {product} by the sum of {name}'s matching "
                        f"column: {why}")
            fix = (f"sum {name} over its last axis, the one the product sums: "
                   f"`{name}.sum(dim=-1, keepdim=True)` (with the clamp or eps you had)")
            yield self.finding(
                what, loc, fix=fix, related=related,
                evidence={"op": e["op"], "batched": e["batched"], "differ": e["differ"],
                          "rows": e["rows"], "matrix": name})

    @staticmethod
    def _denominator_origin(a, loc):
        """``(line, text)`` of the assignment of the division's denominator, when the division
        divides by a bare name that was assigned a ``.sum(`` on another line; else None."""
        if loc is None:
            return None
        found = _DIVISOR.search(a.source.line_text(loc.path, loc.line).split("#")[0])
        if found is None:
            return None
        origin = a.source.value_origin(loc.path, loc.line, found.group(1))
        if origin is None or origin[0] == loc.line or ".sum(" not in origin[1]:
            return None
        return origin
