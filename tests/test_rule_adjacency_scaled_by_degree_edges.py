"""adjacency-scaled-by-degree (GD318) over an edge list: the weights per edge that
instrument/degreenorm.py reads off a message-passing scatter, and the rule at a GCN's backward
(a file of its own: the rule's line is this file's only degree power)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.degreenorm import edge_degree_form
from graddoctor.rules import find_rule

SLUG = "adjacency-scaled-by-degree"


def _edges(n=40, e=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    loops = torch.arange(n)
    row, col = torch.cat([src, dst, loops]), torch.cat([dst, src, loops])
    return row, col, torch.bincount(col, minlength=n).double()


@pytest.mark.parametrize("form, make", [
    ("sqrt", lambda r, c, d: (d[r] * d[c]).sqrt()),
    ("row", lambda r, c, d: d[c]),
    ("column", lambda r, c, d: d[r]),
    ("both", lambda r, c, d: d[r] * d[c]),
])
def test_edge_weights_with_the_degrees_multiplied_in_are_read(form, make):
    row, col, d = _edges()
    assert edge_degree_form(make(row, col, d), col, row) == (form, int(d.max()))


@pytest.mark.parametrize("make", [
    lambda r, c, d: (d[r] * d[c]).rsqrt(),  # GCN
    lambda r, c, d: 1.0 / d[c],  # a mean over incoming edges
    lambda r, c, d: torch.rand(r.numel(), generator=torch.Generator().manual_seed(2)) + 0.1,  # data
    lambda r, c, d: torch.ones(r.numel(), dtype=torch.float64),  # a sum
])
def test_normalised_and_data_edge_weights_read_as_nothing(make):
    row, col, d = _edges()
    assert edge_degree_form(make(row, col, d), col, row) is None


def test_an_edge_list_gcn_with_the_exponents_minus_dropped_is_found_at_the_power():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    row, col, _ = _edges(n=48)
    with Instrumentation(rec):
        deg = torch.zeros(48).index_add_(0, col, torch.ones(col.numel()))
        norm = deg.pow(0.5)[row] * deg.pow(0.5)[col]
        lin = nn.Linear(5, 3)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x, y = torch.randn(48, 5), torch.randint(0, 3, (48,))
        for _ in range(3):
            h = lin(x)
            out = torch.zeros_like(h).index_add_(0, col, h[row] * norm[:, None])
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "degree_scaled"]
    assert [(e["form"], e["nodes"], e["edges"]) for e in events] == [("sqrt", 48, row.numel())]
    found = list(find_rule(SLUG)().check(Analysis(rec.trace)))
    assert len(found) == 1 and "message-passing scatter" in found[0].message
    assert "deg.pow(0.5)" in found[0].message
