"""loss-term-repeated (GD187): the same loss on the same prediction and target twice in one
objective, where the second term was meant to take another operand."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.graphpaths import post_order
from graddoctor.instrument.repeatedloss import call_key, starts_on
from rule_traces import builder, findings, only

SLUG = "loss-term-repeated"


def _prediction():
    return torch.randn(6, 4, requires_grad=True) * 1.0


def test_a_module_call_and_a_functional_call_with_default_options_are_one_term():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    plain = call_key("cross_entropy", out, y, (out, y), {})
    module = call_key("cross_entropy", out, y, (out, y),
                      {"weight": None, "ignore_index": -100, "reduction": "mean",
                       "label_smoothing": 0.0})
    assert plain is not None and plain == module


def test_other_labels_options_or_predictions_are_other_terms():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    plain = call_key("cross_entropy", out, y, (out, y), {})
    assert call_key("cross_entropy", out, y[torch.randperm(6)], (out, y), {}) != plain
    assert call_key("cross_entropy", out, y.clone(), (out, y), {}) != plain  # equal, not the same
    assert call_key("cross_entropy", out, y, (out, y), {"label_smoothing": 0.1}) != plain
    assert call_key("cross_entropy", out, y, (out, y), {"weight": torch.ones(4)}) != plain
    other = _prediction()
    assert call_key("cross_entropy", other, y, (other, y), {}) != plain
    assert call_key("cross_entropy", out, y, (out, y), {"reduction": "none"}) is None
    assert call_key("kl_div", out, y, (out, y), {}) is None  # no start node of its own


def test_the_start_nodes_on_a_prediction_are_counted_in_the_graph():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    twice = F.cross_entropy(out, y) + F.cross_entropy(out, y)
    assert starts_on(post_order(twice.grad_fn, 1000), out.grad_fn, "cross_entropy") == 2
    F.cross_entropy(out, y).item()  # logged: not in the loss's graph
    once = F.cross_entropy(out, y) + out.pow(2).mean()
    assert starts_on(post_order(once.grad_fn, 1000), out.grad_fn, "cross_entropy") == 1
    t = (torch.rand(6, 4) > 0.5).float()
    bce = F.binary_cross_entropy_with_logits(out, t) * 2 + F.binary_cross_entropy_with_logits(out, t)
    assert starts_on(post_order(bce.grad_fn, 1000), out.grad_fn,
                     "binary_cross_entropy_with_logits") == 2


def _trace(params):
    t = builder(params=[0, 1])
    t.put(ev.loss_repeated(fn="cross_entropy", first_line=8, params=list(params)), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_points_at_the_repeat_and_names_the_first_call():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9 and "as on line 8" in f.message


def test_the_rule_is_silent_when_nothing_trained_makes_the_prediction():
    assert findings(_trace([7]), SLUG) == []
