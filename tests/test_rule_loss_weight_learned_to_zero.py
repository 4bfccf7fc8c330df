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
