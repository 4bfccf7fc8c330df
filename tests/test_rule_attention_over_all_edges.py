"""attention-over-all-edges (GD342): the softmax over every edge that instrument/selfscatter.py
finds below a scatter's messages, and the rule's line."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.selfscatter import _edge_softmax
from graddoctor.rules import find_rule

SLUG = "attention-over-all-edges"


def _scores(n=20, e=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    h = torch.randn(n, 4, requires_grad=True)
    score = (h[src] * h[dst]).sum(-1)
    return h, src, dst, score


def _message_of(out):
    return out.grad_fn.next_functions[1][0]  # IndexAddBackward0's source


def test_a_softmax_over_all_edges_is_found_below_the_message():
    h, src, dst, score = _scores()
    out = torch.zeros(20, 4).index_add(0, dst, h[src] * torch.softmax(score, dim=0)[:, None])
    assert _edge_softmax(_message_of(out), 60) == "softmax"
    out = torch.zeros(20, 4).index_add(0, dst, h[src] * score.log_softmax(-1).exp()[:, None])
    assert _edge_softmax(_message_of(out), 60) == "log_softmax"


def test_a_segment_softmax_or_a_softmax_over_heads_is_nothing():
    h, src, dst, score = _scores()
    w = score.exp()
    alpha = w / torch.zeros(20).index_add(0, dst, w)[dst]
    out = torch.zeros(20, 4).index_add(0, dst, h[src] * alpha[:, None])
    assert _edge_softmax(_message_of(out), 60) is None
    heads = torch.softmax(torch.stack([score, -score], 1), dim=1)
    out = torch.zeros(20, 4).index_add(0, dst, h[src] * heads[:, :1])
    assert _edge_softmax(_message_of(out), 60) is None


def _gat(dim, targets=20):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    src, dst = torch.randint(0, 20, (60,)), torch.randint(0, targets, (60,))
    with Instrumentation(rec):
        lin = nn.Linear(4, 4)
        att = nn.Parameter(torch.randn(4))
        opt = torch.optim.SGD([*lin.parameters(), att], lr=0.1)
        x, y = torch.randn(20, 4), torch.randint(0, 4, (20,))
        for _ in range(3):
            h = lin(x)
            e = (h[src] * att).sum(-1)
            alpha = torch.softmax(torch.stack([e, -e], dim=1), dim=dim)[:, 0]
            out = torch.zeros(20, 4).index_add(0, dst, h[src] * alpha[:, None])
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "softmax_over_edges"]
    return events, list(find_rule(SLUG)().check(Analysis(rec.trace)))


def test_the_rule_warns_once_per_backward_line_and_not_for_one_target_or_the_other_axis():
    events, found = _gat(0)
    assert [(e["edges"], e["targets"], e["fn"]) for e in events] == [(60, 20, "softmax")]
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert _gat(1) == ([], [])
    assert _gat(0, targets=1) == ([], [])  # a readout into one target
