"""sample-weights-broadcast (GD164): which products of a loss's graph read as per-sample factors
broadcast to every pair, which stay silent, where the rule points, and what it says."""

from __future__ import annotations

import ast

import torch
import torch.nn.functional as F
from aside_traces import check, update
from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.factorcast import factor_broadcasts
from graddoctor.rules.sample_weights_broadcast import SampleWeightsBroadcast, _product_line
from graddoctor.trace import TraceBuilder
from torch import nn


def _graph(loss):
    return factor_broadcasts(loss.grad_fn)


def _column_output(n=6):
    torch.manual_seed(0)
    return nn.Linear(3, 1)(torch.randn(n, 3))


def test_vector_weights_against_column_terms_are_found_both_ways_round():
    out = _column_output()
    w = torch.rand(6)
    assert _graph((out * w).mean()) == [("mul", [6, 1], [6], [6, 6], False)]
    assert _graph((w * out).sum()) == [("mul", [6, 1], [6], [6, 6], False)]
    assert _graph((out / w).sum()) == [("div", [6, 1], [6], [6, 6], False)]
    assert _graph((out.squeeze(1) * w.unsqueeze(1)).mean()) == [("mul", [6], [6, 1], [6, 6], False)]


def test_found_below_other_pointwise_terms_and_in_four_dimensions():
    out = _column_output()
    per = F.binary_cross_entropy_with_logits(out, torch.rand(6, 1), reduction="none")
    alpha = torch.rand(6)
    assert _graph((alpha * (1 - torch.exp(-per)) ** 2 * per).mean())[0][:4] == ("mul", [6, 1], [6], [6, 6])
    pixels = nn.Conv2d(2, 1, 1)(torch.randn(3, 2, 4, 4))
    mask = torch.rand(3, 4, 4)
    assert _graph((pixels * mask).sum() / mask.sum()) == [("mul", [3, 1, 4, 4], [3, 4, 4], [3, 3, 4, 4], False)]


def test_a_factor_with_gradient_is_found_too():
    out = _column_output()
    other = nn.Linear(3, 1)(torch.randn(6, 3)).squeeze(1)
    assert _graph((out * other).mean()) == [("mul", [6, 1], [6], [6, 6], True)]


def test_silent_on_matching_layouts_other_axes_and_pairwise_terms():
    out = _column_output()
    w = torch.rand(6)
    assert _graph((out * w.unsqueeze(1)).mean()) == []
    assert _graph((out.squeeze(1) * w).mean()) == []
    logits = nn.Linear(3, 5)(torch.randn(6, 3))
    assert _graph((logits * torch.rand(5) * w[:, None]).mean()) == []  # per-class and per-sample
    assert _graph((logits * out).mean()) == []  # (6, 5) by a (6, 1) column: grows no axis
    s = out.squeeze(1)
    assert _graph((s[:, None] * s).mean()) == []  # a pairwise term on purpose
    assert _graph((s.view(-1, 1) * s).mean()) == []
    assert _graph((torch.rand(6, 6) * (s[:, None] - s[None, :])).mean()) == []
    assert _graph((out * 3.0).mean() + (2 * out).sum()) == []


def test_the_model_and_library_losses_are_not_walked_into():
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    inside = nn.Linear(6, 1)((nn.Linear(3, 1)(x) * torch.rand(6)))  # (6, 6) made inside a model
    assert _graph(F.mse_loss(inside, torch.randn(6, 1))) == []


def _trace(op="mul", term=(8, 1), factor=(8,), shape=(8, 8), line=12):
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    t.put(ev.factor_broadcast(op=op, term_shape=list(term), factor_shape=list(factor),
                              shape=list(shape), factor_grad=False), line)
    update(t, 20)
    return t


def test_the_rule_reports_at_the_backward_when_the_source_is_unknown():
    [f] = check(SampleWeightsBroadcast, _trace())
    assert (f.severity, f.location.line, f.step) == (Severity.WARNING, 12, 2)
    assert "(8, 1)" in f.message and "(8,)" in f.message and "(8, 8)" in f.message
    assert "every sample's factor" in f.message
    assert f.fix.startswith("give the factor the terms' shape: .squeeze(1) the (8, 1) one")
    [g] = check(SampleWeightsBroadcast, _trace(op="div", term=(8,), factor=(8, 1)))
    assert "'/'" in g.message and ".squeeze(1) the (8, 1) one or .unsqueeze(1) the (8,) one" in g.fix


def test_the_product_is_found_along_what_the_backward_reads():
    src = """
def weighted(per, w):
    scaled = per + 1
    return (scaled * w).mean()

for step in range(3):
    per_sample = crit(model(x), y)
    weights = w[idx] / w.sum()
    policy_loss = -(log_prob * adv).mean()
    value_loss = 0.5 * err.pow(2).mean()
    (policy_loss + 0.5 * value_loss).backward()
    loss = weighted(per_sample, w[idx])
    loss.backward()
"""
    tree = ast.parse(src)
    line, products = _product_line(tree, 11)
    assert line == 9 and ast.unparse(products[0]) == "log_prob * adv"
    line, products = _product_line(tree, 13)
    assert line == 4 and ast.unparse(products[0]) == "scaled * w"
    assert _product_line(ast.parse("loss = crit(out, y)\nloss.backward()\n"), 2) is None
