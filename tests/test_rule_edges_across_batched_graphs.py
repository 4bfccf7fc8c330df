"""edges-across-batched-graphs (GD341): a batch of graphs read out by its batch vector while the
message-passing edges (instrument/selfscatter.py) join its graphs or reach few of them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules import find_rule

SLUG = "edges-across-batched-graphs"


def _run(shift):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    sizes = [6, 7, 5, 8, 6, 7, 5, 6]
    edge_lists, offset = [], 0
    for n in sizes:
        e = torch.randint(0, n, (2, 12))
        edge_lists.append(e + offset if shift else e)
        offset += n
    edge_index = torch.cat(edge_lists, dim=1)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    x, y = torch.randn(offset, 4), torch.randint(0, 2, (len(sizes),))
    with Instrumentation(rec):
        lin, head = nn.Linear(4, 4), nn.Linear(4, 2)
        opt = torch.optim.SGD([*lin.parameters(), *head.parameters()], lr=0.1)
        for _ in range(3):
            h = lin(x)
            h = h + torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])
            pooled = torch.zeros(len(sizes), 4).index_add_(0, batch, h)
            loss = F.cross_entropy(head(pooled), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "edges_across_graphs"]
    return events, list(find_rule(SLUG)().check(Analysis(rec.trace)))


def test_edges_not_shifted_per_graph_are_found_once():
    events, found = _run(shift=False)
    assert len(events) == 1 and events[0]["graphs"] == 8 and events[0]["reached"] <= 2
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    # no line of this file collects an edge index as it is (the append shifts it on a
    # condition): the rule points at the backward
    assert found[0].location.line == _run.__code__.co_firstlineno + 21


def test_edges_shifted_per_graph_say_nothing():
    assert _run(shift=True) == ([], [])
