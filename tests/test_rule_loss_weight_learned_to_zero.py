"""loss-weight-learned-to-zero (GD192): the weighted terms instrument/lossweight.py finds in a
loss's graph, the other paths that bound a weight, the one-way test of the factor's values, and
the rule over hand-written traces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.lossweight import _reached_otherwise, held, moves_one_way, weighted_terms
from rule_traces import builder, findings, only

SLUG = "loss-weight-learned-to-zero"

S = torch.zeros(2, requires_grad=True)
SIGMA = torch.ones(2, requires_grad=True)
W = torch.tensor(0.5, requires_grad=True)
OUT = torch.randn(8, 3, requires_grad=True)
Y = torch.randn(8, 3)
LABELS = torch.randint(0, 3, (8,))


def _unbounded(loss):
    """(kind, leaf is which) of the weighted terms no other path of the loss reaches."""
    root = loss.grad_fn
    terms = weighted_terms(root)
    others = _reached_otherwise(root, {node: index for node, index, *_ in terms})
    names = {id(S): "s", id(SIGMA): "sigma", id(W): "w"}
    return sorted((kind, names.get(id(leaf), "?")) for _, _, kind, leaf, element in terms
                  if not held(others, leaf, element))


@pytest.mark.parametrize("loss, found", [
    (lambda: 0.5 * torch.exp(-S[0]) * F.mse_loss(OUT, Y) + torch.exp(-S[1]) * F.cross_entropy(OUT, LABELS),
     [("mul", "s"), ("mul", "s")]),
    (lambda: (torch.exp(-S) * torch.stack([F.mse_loss(OUT, Y), F.l1_loss(OUT, Y)])).sum(), [("mul", "s")]),
    (lambda: ((OUT - Y) ** 2).mean() / (2 * SIGMA[0] ** 2), [("div", "sigma")]),
    (lambda: F.cross_entropy(OUT, LABELS) + W * F.smooth_l1_loss(OUT, Y), [("mul", "w")]),
    (lambda: F.softplus(W) * (OUT - Y).abs().mean(), [("mul", "w")]),
    # the regulariser of s[0] does not hold s[1]
    (lambda: torch.exp(-S[0]) * F.mse_loss(OUT, Y) + S[0] + torch.exp(-S[1]) * F.l1_loss(OUT, Y),
     [("mul", "s")]),
])
def test_a_weight_that_only_multiplies_losses_is_found(loss, found):
    assert _unbounded(loss()) == found


@pytest.mark.parametrize("loss", [
    # Kendall's regulariser: another path reaches s
    lambda: (torch.exp(-S) * torch.stack([F.mse_loss(OUT, Y), F.l1_loss(OUT, Y)]) + S).sum(),
    lambda: F.mse_loss(OUT, Y) / (2 * SIGMA[0] ** 2) + torch.log(SIGMA[0]),
    lambda: torch.exp(-S[0]) * F.mse_loss(OUT, Y) + S[0] + torch.exp(-S[1]) * F.l1_loss(OUT, Y) + S[1],
    lambda: (torch.exp(-S[0]) * F.mse_loss(OUT, Y) + torch.exp(-S[1]) * F.l1_loss(OUT, Y) + S.sum()),
    # the factor is no loss: a product with data that changes sign (SAC's temperature)
    lambda: -(S[0] * (OUT.sum(1) + 1.0).detach()).mean(),
    # a logit scale inside the softmax: the product is no loss
    lambda: F.cross_entropy(W.exp() * OUT, LABELS),
    # a temperature that also divides the logits
    lambda: W ** 2 * F.kl_div(F.log_softmax(OUT / W, 1), F.softmax(Y, 1), reduction="batchmean"),
    # the weighted term is subtracted: ascent on the weight, not this rule's
    lambda: F.mse_loss(OUT, Y) - W * F.l1_loss(OUT, Y),
    # a product of a weight and a term that may be negative (a hand-written log-likelihood)
    lambda: W * (OUT * Y).mean(),
])
def test_weights_held_or_not_weighing_a_loss_are_not(loss):
    assert _unbounded(loss()) == []


def test_the_factor_must_move_only_the_gradients_way_and_move():
    assert moves_one_way([[1.0, 1.0], [0.9, 0.95], [0.8, 0.95], [0.7, 0.9]], down=True) == 3
    assert moves_one_way([[1.0, 1.0], [0.9, 1.05], [0.8, 0.9]], down=True) is None  # renormalised
    assert moves_one_way([[1.0], [1.0], [1.0]], down=True) == 0  # never moved
    assert moves_one_way([[1.0], [1.0], [0.9], [0.9], [0.8]], down=True) == 2  # accumulation
    assert moves_one_way([[1.0], [1.1], [1.2]], down=False) == 2  # a growing denominator
    assert moves_one_way([[0.1], [0.2], [0.3]], down=True) is None  # ascent


def _trace(params, elements=None):
    t = builder(params=[0, 1])
    t.clear([0, 1], line=10)
    t.put(ev.loss_weight_learned(params=list(params), kinds=["mul"], terms=2, backwards=4,
                                 elements=elements, line=11), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_the_weight_is_stepped():
    f = only(_trace([1]), SLUG)
    assert f.location.line == 11 and f.evidence == {"params": [1], "kinds": ["mul"], "terms": 2}


def test_the_rule_names_the_elements_the_terms_select():
    f = only(_trace([1], elements=[[2]]), SLUG)
    assert "[2] reaches" in f.message
    f = only(_trace([1], elements=[[0, 2]]), SLUG)
    assert "[0] and " in f.message and "[2] reach " in f.message


def test_the_rule_is_silent_on_tensors_no_optimizer_steps():
    assert findings(_trace([7]), SLUG) == []


# a regulariser with the term's slope holds nothing: exp(-s) * loss - s falls as s grows on both
# paths (the widening for Kendall's weighting with its regulariser's sign flipped)

from graddoctor.analysis.source import subtracted_beside_factor, subtracting_lines  # noqa: E402
from graddoctor.instrument.lossweight import LearnedWeightWatcher, chain_direction, regulariser_terms  # noqa: E402


def _reversed_names(loss):
    root = loss.grad_fn
    terms = weighted_terms(root)
    others = _reached_otherwise(root, {node: index for node, index, *_ in terms})
    found = LearnedWeightWatcher._reversed(root, terms, others)
    names = {id(S): "s", id(SIGMA): "sigma"}
    return sorted((names[leaf], element) for leaf, element in found)


def _l():
    return F.mse_loss(OUT, Y)


@pytest.mark.parametrize("loss, found", [
    (lambda: torch.exp(-S[0]) * _l() - S[0], [("s", (0, 0))]),
    (lambda: torch.exp(-S[0]) * _l() - 0.5 * S[0] + torch.exp(-S[1]) * _l() + S[1], [("s", (0, 0))]),
    (lambda: _l() / (2 * SIGMA[1] ** 2) - torch.log(SIGMA[1]), [("sigma", (0, 1))]),
    (lambda: (torch.exp(-S[0]) * _l() - S[0]).mean(), [("s", (0, 0))]),
])
def test_a_regulariser_with_the_terms_slope_is_found(loss, found):
    assert _reversed_names(loss()) == found


@pytest.mark.parametrize("loss", [
    lambda: torch.exp(-S[0]) * _l() + S[0],  # Kendall's
    lambda: torch.exp(-S[0]) * _l() - (-S[0]),  # the same, written as a subtraction
    lambda: _l() / (2 * SIGMA[0] ** 2) + torch.log(SIGMA[0]),
    lambda: torch.exp(S[0]) * _l() - S[0],  # a minimum exists: the term rises as s grows
    lambda: torch.exp(-S[0]) * _l() - S[0] + 2 * S[0],  # another path rises (held)
    lambda: torch.exp(-S[0]) * _l() - S[1],  # another element
])
def test_regularisers_that_hold_the_weight_are_not(loss):
    assert _reversed_names(loss()) == []


def test_the_direction_of_a_chain_down_to_a_leaf():
    assert chain_direction(torch.exp(-S[0]).grad_fn) == -1.0
    assert chain_direction((2 * SIGMA[0] ** 2).grad_fn) == 1.0
    assert chain_direction((1 / (2 * SIGMA[0] ** 2)).grad_fn) == -1.0  # a reciprocal
    assert chain_direction((-3 * S[1]).grad_fn) == -1.0
    assert chain_direction((S[0] ** 2).grad_fn) is None  # the base's sign is not known (0)
    assert chain_direction((S[0] * S[1]).grad_fn) is None
    terms = regulariser_terms((_l() * torch.exp(-S[0]) - S[0] + torch.log(SIGMA[1])).grad_fn)
    assert sorted(slope for _, slope, _, _ in terms) == [-1.0, 1.0]


def test_the_rule_points_at_the_line_that_subtracts_the_weight(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "model = make()\n"
                      "def combined(l0, l1, log_vars):\n"
                      "    w = torch.exp(-log_vars[0]) * l0 - log_vars[0]\n"
                      "    return w + torch.exp(-log_vars[1]) * l1 + log_vars[1]\n"
                      "for step in range(4):\n"
                      "    loss = combined(a, b, model.log_vars)\n"
                      "    loss.backward()\n")
    from graddoctor.trace import TraceBuilder
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=2)
    t.put(ev.loss_weight_learned(params=[1], kinds=["mul"], terms=2, backwards=4, elements=[[0]],
                                 line=8, reversed=[True]), line=8)
    for _ in range(4):
        t.backward(fresh=[0, 1], line=8)
        t.step(0, line=8)
    f = only(t, SLUG)
    assert f.location.line == 4 and f.evidence["reversed"] is True
    assert "same way" in f.message and "+ s" in f.fix


def test_the_source_finds_the_subtracted_weight(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a = torch.exp(-log_vars[0]) * l0 - log_vars[0]\n"
                      "b = torch.exp(-log_vars[1]) * l1 + log_vars[1]\n"
                      "c = l2 - self.log_vars[2]  # a comment - log_vars[0]\n"
                      "d = torch.exp(-s[3]) * l3 - s[3]\n"
                      "e = x - log_vars_other[0]\n")
    path = str(script)
    assert [n for n, _ in subtracting_lines(path, "model.log_vars[0]")] == [1]
    assert [n for n, _ in subtracting_lines(path, "log_vars[1]")] == []
    assert [n for n, _ in subtracting_lines(path, "log_vars[2]")] == [3]
    assert [n for n, _ in subtracting_lines(path, "log_vars")] == []
    assert [n for n, _ in subtracted_beside_factor(path, "[3]")] == [4]
    assert [n for n, _ in subtracted_beside_factor(path, "[2]")] == []
