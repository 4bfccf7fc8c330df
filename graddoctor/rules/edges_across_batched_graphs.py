from __future__ import annotations

import linecache
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

# an edge index appended or stacked as it is (no node offset added) inside the script
_EDGE_NAME = r"(?:ei|edges?|edge_index\w*|\w*edge_index|\w*_edges?)"
_COLLECTED = re.compile(rf"\.(?:append|extend)\(\s*(?:\w+\.)?{_EDGE_NAME}\s*\)"
                        rf"|\b(?:cat|stack)\(\s*\[\s*(?:\w+\.)?{_EDGE_NAME}\s+for\b")


class EdgesAcrossBatchedGraphs(Rule):
    """
    ## What it does
    Finds a batch of graphs whose edges were not shifted to the batch's node numbering: a
    readout that scatters node rows by a sorted batch vector (`index_add_(0, batch, x)`,
    `scatter_add`, `scatter_reduce`) while the message-passing scatters of the same loss join
    nodes of two different graphs (20% of their edges or more, self-loops left out) or reach
    fewer than a quarter of the batch's graphs. Read at the first 3 backwards of each backward
    line in the loss's graph (the gather and scatter indices of each layer, the readout's
    index). It points at the script's only line that collects an edge index as it is
    (`edge_list.append(edge_index)`) when it has one, else at the backward.

    ## Why is this bad?
    Batching graphs concatenates their node features, so graph `k`'s nodes are numbered after
    the nodes of graphs `0..k-1`; each graph's edge index must be shifted by that count
    (`edge_index + offset`). Left as it is, every graph's edges point at the first graph's
    nodes: the first graphs get all the messages (and edges into the next graphs), every other
    graph is a bag of isolated nodes, and the model learns from node features alone. Nothing
    fails: the indices are all in range.

    ## Example
    ```python
    for x, edge_index, y in graphs:
        xs.append(x)
        edge_lists.append(edge_index)
        batch.append(torch.full((x.size(0),), len(xs) - 1))
    ```

    ## Use instead
    ```python
        edge_lists.append(edge_index + offset)
        offset += x.size(0)
    ```

    ## Stays silent on
    Edges shifted per graph (a running offset, a `ptr` vector); one graph per step (no batch
    vector); self-loops; graphs without edges (a few); a readout that is a gather or a mean over
    all nodes (no sorted scatter); edges that reach node numbers past the largest graph's size
    (numbered over the batch: the clusters of one graph pooled apart, whose real edges cross
    them). Not seen: batches on an accelerator, a batch vector that is
    not sorted (graphs interleaved), pooling written with a dense assignment matrix.
    """

    code = "GD341"
    slug = "edges-across-batched-graphs"
    severity = Severity.WARNING
    summary = ("a batch of graphs whose edge indices were not shifted by each graph's node "
               "offset: messages cross between graphs and most graphs get no edges")
    fix = ("shift each graph's edge index by the number of nodes batched before it "
           "(`edge_index + offset`, then `offset += num_nodes`) when concatenating")

    def check(self, a):
        for event in a.of_kind("edges_across_graphs"):
            loc = event.loc
            if loc is None:
                continue
            shown = ""
            collected = self._collected_line(a, loc.path)
            if collected is not None:
                loc = Location(loc.path, collected[0], None)
                shown = f"`{collected[1]}` collects an edge index without its node offset: "
            yield self.finding(
                f"{shown}a batch of {event['graphs']} graphs ({event['nodes']} nodes) is read out "
                f"by its batch vector, but {event['across']:.0%} of the {event['edges']} "
                f"message-passing edges join nodes of two different graphs and they reach only "
                f"{event['reached']} of the graphs: the edges were not shifted to the batch's "
                f"node numbering, so most graphs are isolated nodes and the others get "
                f"another graph's messages",
                loc, fix=self.fix,
                evidence={k: event[k] for k in ("graphs", "nodes", "edges", "across", "reached")})

    @staticmethod
    def _collected_line(a, path):
        try:
            lines = linecache.getlines(a.source.full(path))
        except Exception:
            return None
        found = [(n, text.split("  #")[0].strip()) for n, text in enumerate(lines, 1)
                 if _COLLECTED.search(text.split("#")[0])]
        return found[0] if len(found) == 1 else None
