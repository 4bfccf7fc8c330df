"""messages-sent-back-to-source (GD286): which scatters instrument/selfscatter.py reads as
messages gathered and scattered with one index, what it records at a graph layer's backward,
and the line the rule points at."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.analysis.source import self_scatter_line
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.selfscatter import gathered_with
from graddoctor.rules import find_rule

SLUG = "messages-sent-back-to-source"


def _edges(n=30, e=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)


def _scatter_node(out):
    return out.grad_fn


def test_messages_gathered_at_the_source_read_their_gather_index():
    src, dst = _edges()
    h = torch.randn(30, 4, requires_grad=True) * 1.0
    out = torch.zeros(30, 4).index_add_(0, dst, h[src] * 2.0)
    (index,) = gathered_with(out.grad_fn.next_functions[1][0])
    assert torch.equal(index, src)


def test_a_path_with_no_gather_or_through_a_scatter_reads_as_nothing():
    src, dst = _edges()
    h = torch.randn(30, 4, requires_grad=True)
    # a node's own row added next to a gathered one (GraphNorm's x - mean[batch])
    assert gathered_with((h - h[src[:30]]).grad_fn) is None
    edge_w = torch.randn(120, 4, requires_grad=True)
    assert gathered_with((h[src] * edge_w).grad_fn) is None  # an edge feature: a leaf
    inner = torch.zeros(30, 4).index_add_(0, dst, h[src])
    assert gathered_with((inner * 2).grad_fn) is None  # another scatter before any gather


def _layer(scatter_with_source: bool, scatter="index_add"):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    src, dst = _edges(n=40, e=200)
    with Instrumentation(rec):
        lin = nn.Linear(5, 3)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
        into = src if scatter_with_source else dst
        for _ in range(3):
            h = lin(x)
            msg = h.index_select(0, src)
            if scatter == "index_add":
                out = torch.zeros_like(h).index_add_(0, into, msg)
            else:
                out = torch.zeros_like(h).scatter_add(0, into.unsqueeze(-1).expand_as(msg), msg)
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "self_scatter"]
    return events, list(find_rule(SLUG)().check(Analysis(rec.trace)))


def test_messages_scattered_back_to_their_source_are_found_once_per_backward_line():
    for scatter in ("index_add", "scatter_add"):
        events, found = _layer(True, scatter)
        assert [(e["op"], e["edges"]) for e in events] == [(scatter, 200)]
        assert len(found) == 1 and found[0].severity is Severity.WARNING
        assert "index_add_(0, dst" in found[0].fix


def test_messages_scattered_to_the_other_end_say_nothing():
    for scatter in ("index_add", "scatter_add"):
        assert _layer(False, scatter) == ([], [])


def test_the_line_is_the_scatter_whose_rows_gather_with_its_own_index(tmp_path):
    script = tmp_path / "layer.py"
    script.write_text(textwrap.dedent("""\
        deg = torch.zeros(n).index_add_(0, col, torch.ones(col.numel()))
        def conv(x, row, col, norm):
            msg = x[row] * norm
            return torch.zeros_like(x).index_add_(0, row, msg)
        def conv_expanded(h, dst):
            neigh = h.index_select(0, dst)
            index = dst.unsqueeze(-1).expand_as(neigh)
            return torch.zeros_like(h).scatter_add(0, index, neigh)
        """))
    assert self_scatter_line(str(script)) is None  # two such scatters: none is told apart
    script.write_text(textwrap.dedent("""\
        deg = torch.zeros(n).index_add_(0, col, torch.ones(col.numel()))
        def conv(x, row, col, norm):
            msg = x[row] * norm
            return torch.zeros_like(x).index_add_(0, row, msg)
        def right(x, row, col):
            return torch.index_add(torch.zeros_like(x), 0, col, x[row])
        """))
    assert self_scatter_line(str(script)) == (4, "torch.zeros_like(x).index_add_(0, row, msg)")


def test_a_mixture_of_experts_dispatch_reads_as_nothing():
    # tokens gathered by top_x, run through an expert and added back at top_x: per token by design,
    # and the expert's weights lie on every path of the message
    h = torch.randn(16, 4, requires_grad=True)
    expert = nn.Linear(4, 4)
    top_x = torch.tensor([0, 3, 5, 9])
    weights = torch.rand(4, 1)
    message = expert(h[top_x]) * weights
    out = torch.zeros(16, 4).index_add_(0, top_x, message)
    assert gathered_with(out.grad_fn.next_functions[1][0]) is None
