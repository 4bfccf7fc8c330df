"""variance-sign-flipped (GD417): the graph walk of instrument/lossterms.py that finds a variance
written with a plus, the source lookup of its line, and the rule over hand-written traces."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.analysis.source import variance_added_lines
from graddoctor.instrument.lossterms import negative_terms, variance_added
from rule_traces import builder, findings, only

SLUG = "variance-sign-flipped"

PRED = torch.rand(32, requires_grad=True)
GT = torch.rand(32) + 0.5


def _d():
    return torch.log(PRED + 0.1) - torch.log(GT)


def test_a_variance_with_a_plus_is_found_below_a_sqrt():
    d = _d()
    found = variance_added((torch.sqrt((d ** 2).mean() + 0.85 * d.mean() ** 2) * 10.0).grad_fn)
    assert found is not None and found[1] is d.grad_fn
    d = _d()
    assert variance_added(((d * d).sum() / 32 + 0.5 * (d.sum() / 32).pow(2)).grad_fn) is not None


def test_the_variance_with_its_minus_or_another_tensors_mean_is_not():
    d = _d()
    assert variance_added(torch.sqrt((d ** 2).mean() - 0.85 * d.mean() ** 2).grad_fn) is None
    d = _d()
    other = PRED * 2
    assert variance_added(((d ** 2).mean() + 0.1 * other.mean() ** 2).grad_fn) is None
    d = _d()
    assert variance_added((d ** 2).mean().grad_fn) is None
    d = _d()  # -E[d²] - E[d]²: maximised, unbounded: loss-unbounded-below's, not this rule's
    loss = -(d ** 2).mean() - d.mean() ** 2
    assert variance_added(loss.grad_fn) is None and negative_terms(loss.grad_fn)


def test_moments_over_different_values_are_not_one_variance():
    h = torch.tanh(PRED.view(8, 4) * 3)
    # the codes' energy plus each feature's mean squared: two penalties, not a variance
    assert variance_added(((h ** 2).mean() + (h.mean(0) ** 2).mean()).grad_fn) is None
    h = torch.tanh(PRED.view(8, 4) * 3)
    # per sample on both sides (a per-image scale-invariant loss with a plus) is still found
    assert variance_added(((h ** 2).mean(1) + 0.5 * h.mean(-1) ** 2).mean().grad_fn) is not None


def test_the_line_that_adds_the_squared_mean_is_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "def silog(d, lam):\n"
        "    return torch.sqrt((d ** 2).mean() + lam * d.mean() ** 2)\n"
        "def right(d, lam):\n"
        "    return torch.sqrt((d ** 2).mean() - lam * d.mean() ** 2)\n"
        "loss = (e ** 2).mean() + 0.1 * f.mean() ** 2\n")
    assert variance_added_lines(str(script)) == [(2, "(d ** 2).mean() + lam * d.mean() ** 2", "d")]


def _trace(params, line=11):
    t = builder(params=[0, 1])
    t.clear([0, 1], line=10)
    t.put(ev.loss_unbounded(term="variance_added", op="PowBackward0", params=list(params), line=line), line=line)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_at_the_backward_when_the_script_has_no_such_line():
    f = only(_trace([1]), SLUG)
    assert f.location.line == 11 and f.evidence["params"] == [1]
    assert "scale-invariant" in f.message and "d.mean() ** 2" in f.fix


def test_the_rule_is_silent_on_tensors_no_optimizer_steps_and_other_terms():
    assert findings(_trace([7]), SLUG) == []
    t = builder(params=[0, 1])
    t.put(ev.loss_unbounded(term="square", op="PowBackward0", params=[1], line=11), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    assert findings(t, SLUG) == []


def test_loss_unbounded_below_leaves_the_variance_term_alone():
    assert findings(_trace([1]), "loss-unbounded-below") == []
