"""adjacency-scaled-by-degree (GD318): the degree forms instrument/degreenorm.py reads off a
propagation matrix, what it records at a GCN's backward, and the rule's line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.degreenorm import degree_form
from graddoctor.rules import find_rule

SLUG = "adjacency-scaled-by-degree"


def _graph(n=40, p=0.12, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.triu((torch.rand(n, n, generator=g) < p).float(), diagonal=1)
    a = a + a.t() + torch.eye(n)
    return a, a.sum(1)


@pytest.mark.parametrize("form, make", [
    ("sqrt", lambda a, d: d.sqrt()[:, None] * a * d.sqrt()[None, :]),
    ("row", lambda a, d: a * d[:, None]),
    ("column", lambda a, d: a * d[None, :]),
    ("both", lambda a, d: d[:, None] * a * d[None, :]),
])
def test_degrees_multiplied_in_are_read(form, make):
    a, d = _graph()
    assert degree_form(make(a, d)) == (form, int(d.max()))


@pytest.mark.parametrize("make", [
    lambda a, d: d.rsqrt()[:, None] * a * d.rsqrt()[None, :],  # GCN
    lambda a, d: a / d[:, None],  # a mean
    lambda a, d: a / d[None, :],
    lambda a, d: a,  # a sum aggregation (GIN)
    lambda a, d: a * torch.rand(a.shape, generator=torch.Generator().manual_seed(1)),  # weighted
    lambda a, d: torch.eye(len(d)) - d.rsqrt()[:, None] * a * d.rsqrt()[None, :],  # a Laplacian
])
def test_normalised_raw_weighted_and_signed_matrices_read_as_nothing(make):
    a, d = _graph()
    assert degree_form(make(a, d)) is None


def test_a_regular_graph_and_a_small_matrix_say_nothing():
    n = 16
    ring = torch.roll(torch.eye(n), 1, 0) + torch.roll(torch.eye(n), -1, 0) + torch.eye(n)
    assert degree_form(ring * 3.0) is None  # every degree is 3: every form is one scale
    a, d = _graph(n=6, p=0.5)
    assert degree_form(d.sqrt()[:, None] * a * d.sqrt()[None, :]) is None  # under 8 nodes


def _gcn(exponent):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    a, _ = _graph(n=48)
    with Instrumentation(rec):
        deg = a.sum(dim=1)
        d_inv_sqrt = deg.pow(exponent)
        adj_hat = d_inv_sqrt[:, None] * a * d_inv_sqrt[None, :]
        lin = nn.Linear(5, 3)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x, y = torch.randn(48, 5), torch.randint(0, 3, (48,))
        for _ in range(3):
            loss = F.cross_entropy(adj_hat @ lin(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "degree_scaled"]
    return events, list(find_rule(SLUG)().check(Analysis(rec.trace)))


def test_a_gcn_with_the_exponents_minus_dropped_is_found_once_at_the_power():
    events, found = _gcn(0.5)
    assert [(e["form"], e["nodes"]) for e in events] == [("sqrt", 48)]
    # this test file raises a degree in one assignment only: the rule points at it
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == _gcn.__code__.co_firstlineno + 6
    assert "deg.pow(-0.5)" in found[0].fix
    assert _gcn(-0.5) == ([], [])
