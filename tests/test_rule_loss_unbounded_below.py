"""loss-unbounded-below (GD246): the signed walk of instrument/lossterms.py, the source lookup
of the term's line, and the rule over hand-written traces."""

from __future__ import annotations

import pytest
import torch

from graddoctor import events as ev
from graddoctor.analysis.source import term_line
from graddoctor.instrument.lossterms import negative_terms
from rule_traces import builder, findings, only

SLUG = "loss-unbounded-below"

MU = torch.randn(4, 3, requires_grad=True)
LV = torch.randn(4, 3, requires_grad=True)
X = torch.randn(4, 3)


def _terms(loss):
    return sorted(term for term, _node, _arg in negative_terms(loss.grad_fn))


@pytest.mark.parametrize("loss, terms", [
    (lambda: 0.5 * torch.sum(1 + LV - MU.pow(2) - LV.exp()), ["exp", "square"]),
    (lambda: X.sum() - (-0.5 * torch.sum(1 + LV - MU ** 2 - torch.exp(LV))), ["exp", "square"]),
    (lambda: -((X - MU) ** 2).mean(), ["square"]),
    (lambda: (X - MU * MU).mean(), ["square"]),
    (lambda: torch.mean(-torch.exp(LV), dim=0).sum() / 2, ["exp"]),
])
def test_negative_exp_and_square_terms_are_found(loss, terms):
    assert _terms(loss()) == terms


@pytest.mark.parametrize("loss", [
    lambda: -0.5 * torch.sum(1 + LV - MU.pow(2) - LV.exp()),  # the KL, right sign
    lambda: (0.5 * LV + 0.5 * (X - MU) ** 2 * torch.exp(-LV)).mean(),  # a product: not followed
    lambda: (torch.exp(LV) - X * LV).mean(),  # a Poisson loss
    lambda: -torch.exp(torch.tanh(LV)).mean(),  # bounded
    lambda: -torch.exp(LV.clamp(max=2)).mean(),
    lambda: -torch.logsumexp(-MU ** 2, 1).mean(),  # under a log
    lambda: -(MU ** 3).mean(),  # an odd power: not a square
])
def test_bounded_or_unknown_terms_are_not(loss):
    assert _terms(loss()) == []


P = lambda: torch.softmax(MU, dim=-1).mean(0)


@pytest.mark.parametrize("loss", [
    # the exp of an entropy written out (a codebook's perplexity, subtracted): at most n
    lambda: (lambda p: 1 - torch.exp(-torch.sum(p * torch.log(p + 1e-7), dim=-1)).sum() / 3)(P()),
    lambda: (lambda p: -torch.exp(-(p * p.log()).sum() * 0.5).mean())(P()),
])
def test_the_exp_of_an_entropy_is_bounded(loss):
    assert _terms(loss()) == []


@pytest.mark.parametrize("loss", [
    lambda: -torch.exp(-torch.sum(MU * torch.log(MU.abs()))),  # x may be negative
    lambda: -torch.exp(-torch.sum(LV.exp() * torch.log(MU.exp()))),  # log of another tensor
])
def test_what_only_looks_like_an_entropy_is_still_found(loss):
    assert _terms(loss()) == ["exp"]


def test_the_terms_line_is_found_unless_the_loss_negates_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "for step in range(3):\n"
        "    z = mu + eps * torch.exp(0.5 * logvar)\n"
        "    kld = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())\n"
        "    loss = bce + kld\n"
        "    other = bce - kld\n"
        "    third = bce + kld + (x ** 2).sum()\n")
    # two lines compute an exp: no single line
    assert term_line(str(script), 4, "exp") is None
    assert term_line(str(script), 4, "square") == (3, "kld = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())")
    assert term_line(str(script), 5, "square") is None  # bce - kld: the loss's line flips it
    assert term_line(str(script), 6, "square") is None  # the square is in the loss's own line


def test_a_loss_negating_another_name_keeps_the_loss_line(tmp_path):
    # the KL's mu ** 2 sits inside model.kl(); the one square written here is the data term
    script = tmp_path / "train.py"
    script.write_text(
        "for step in range(3):\n"
        "    nll = (0.5 * ((yb - pred) / s) ** 2).sum()\n"
        "    kl = model.kl()\n"
        "    loss = (nll - kl) / n\n"
        "    loss2 = -kl + nll\n")
    assert term_line(str(script), 4, "square") is None
    assert term_line(str(script), 5, "square") is None


def test_a_term_subtracted_with_its_weight_keeps_the_loss_line(tmp_path):
    # the square is written on its own line with a plus sign; the minus is the loss's
    script = tmp_path / "train.py"
    script.write_text(
        "for step in range(3):\n"
        "    eik = ((g.norm(dim=-1) - 1.0) ** 2).mean()\n"
        "    loss = fit - lam * eik\n"
        "    loss2 = fit - eik / 2\n"
        "    loss3 = fit + lam * eik\n"
        "    loss4 = -(lam * eik) + fit\n")
    assert term_line(str(script), 3, "square") is None
    assert term_line(str(script), 4, "square") is None
    assert term_line(str(script), 5, "square") == (2, "eik = ((g.norm(dim=-1) - 1.0) ** 2).mean()")
    assert term_line(str(script), 6, "square") is None


def _trace(params):
    t = builder(params=[0, 1])
    t.clear([0, 1], line=10)
    t.put(ev.loss_unbounded(term="exp", op="ExpBackward0", params=list(params), line=11), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_the_terms_parameters_are_stepped():
    f = only(_trace([1]), SLUG)
    assert f.location.line == 11 and f.evidence == {"term": "exp", "op": "ExpBackward0", "params": [1]}


def test_the_rule_is_silent_on_tensors_no_optimizer_steps():
    assert findings(_trace([7]), SLUG) == []


def test_a_variance_written_out_is_not_unbounded():
    from graddoctor.rules.loss_unbounded_below import _variance_form

    assert _variance_form("return (g ** 2).mean() - lam * g.mean() ** 2")
    assert _variance_form("loss = torch.mean(d.pow(2)) - 0.85 * torch.mean(d) ** 2")
    assert not _variance_form("loss = (g ** 2).mean() - 2.0 * g.mean() ** 2")  # factor above 1
    assert not _variance_form("loss = mse - h.mean() ** 2")  # no mean of h's squares
    assert not _variance_form("loss = (")


def test_the_squares_of_a_part_subtracted_from_the_squares_of_the_whole_are_bounded():
    z = MU - MU.mean(0)
    cov = z.T @ z / 3
    # VICReg's off-diagonal covariance written as total minus diagonal: the rest's squares
    assert _terms(cov.pow(2).sum() - cov.diagonal().pow(2).sum()) == []
    assert _terms((MU ** 2).sum() - (MU[:, 0] ** 2).sum()) == []
    # the squares of a part subtracted from nothing of its whole stay unbounded
    assert _terms(X.sum() - cov.diagonal().pow(2).sum()) == ["square"]


def test_a_max_of_multiples_of_one_sign_is_a_linear_term():
    from graddoctor.instrument.lossterms import negative_terms
    e = torch.randn(8, 3, requires_grad=True)
    q = torch.tensor([0.1, 0.5, 0.9])
    terms = lambda loss: [t for t, _, _ in negative_terms(loss.grad_fn)]
    assert terms(torch.max(q * e, (1 - q) * e).mean()) == ["linear"]
    assert terms(torch.maximum(0.3 * e, 0.7 * e).sum()) == ["linear"]
    assert terms(-torch.minimum(q * e, (1 - q) * e).mean()) == ["linear"]
    # a pinball loss: opposite signs; a leaky ReLU; a max with another tensor
    assert terms(torch.max(q * e, (q - 1) * e).mean()) == []
    assert terms(torch.max(e, 0.01 * e).mean()) == []
    assert terms(torch.max(q * e, q * torch.tanh(e)).mean()) == []


S = torch.randn(6, 4, requires_grad=True)  # scores of 4 classes or actions
A = torch.tensor([0, 3, 1, 1, 2, 0])


@pytest.mark.parametrize("loss, terms", [
    (lambda: S.gather(1, A[:, None]).mean() - torch.logsumexp(S, dim=1).mean(), ["logsumexp"]),  # CQL flipped
    (lambda: (S[torch.arange(6), A] - torch.logsumexp(S, -1)).mean(), ["logsumexp"]),
    (lambda: -(torch.logsumexp(S.view(6, 4), 1) - S.gather(1, A[:, None]).squeeze(1)).mean(), ["logsumexp"]),
    (lambda: torch.log_softmax(S, -1).gather(1, A[:, None]).mean(), ["log_softmax"]),  # a minus missing
])
def test_a_log_softmax_minimised_is_found(loss, terms):
    assert _terms(loss()) == terms


@pytest.mark.parametrize("loss", [
    lambda: torch.logsumexp(S, dim=1).mean() - S.gather(1, A[:, None]).mean(),  # CQL's term
    lambda: -(S.gather(1, A[:, None]).squeeze(1) - torch.logsumexp(S, dim=-1)).mean(),
    lambda: -torch.log_softmax(S, -1).gather(1, A[:, None]).mean(),  # the NLL
    lambda: -(torch.logsumexp(S, 1) - 1.5).mean(),  # IWAE's log-mean-exp
    lambda: -torch.logsumexp(S, 1).mean() + torch.logsumexp(S * 2, 1).mean(),  # JEM: data vs samples
    lambda: torch.log_softmax(S, -1)[:, 0].mean(),  # a constant column (a discriminator's class)
    lambda: (X[:, :1] - torch.logsumexp(S[:3, :3], 1)).mean(),  # no entry of the same scores
])
def test_log_likelihoods_with_their_minus_or_other_logsumexps_are_not(loss):
    assert _terms(loss()) == []


def test_the_log_softmax_terms_line_is_found(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("q = net(s)\ncql = q.gather(1, a).mean() - torch.logsumexp(q, 1).mean()\n"
                    "loss = td + alpha * cql\nloss.backward()\n")
    assert term_line(str(path), 3, "logsumexp") == (2, "cql = q.gather(1, a).mean() - torch.logsumexp(q, 1).mean()")


def test_a_log_probability_the_loss_also_uses_elsewhere_is_not_judged_alone():
    logp = torch.log_softmax(S, -1).gather(1, A[:, None]).squeeze(1)
    ref = torch.randn(6)
    k3 = torch.exp(ref - logp) - (ref - logp) - 1  # adds +logp, balanced by its exp
    assert _terms((0.04 * k3).mean()) == []


# -- a squared error weighted by a tensor with entries of the other sign ----------------------

W_MIXED = torch.tensor([1.0, -0.5, 2.0])


@pytest.mark.parametrize("loss", [
    lambda: ((X - MU) ** 2 * W_MIXED).mean(),  # cos(lat) of degrees: some weights negative
    lambda: (((X - MU) ** 2).sum(0) * W_MIXED).mean(),  # reduced first, then weighted
    lambda: (W_MIXED * (X - MU).pow(2)).sum(),
    lambda: -((X - MU) ** 2 * W_MIXED.abs()).mean(),  # positive weights, the whole negated
])
def test_a_square_weighted_by_a_tensor_with_a_negative_entry_is_found(loss):
    assert _terms(loss()) == ["weighted_square"]


@pytest.mark.parametrize("loss", [
    lambda: ((X - MU) ** 2 * W_MIXED.abs()).mean(),  # latitude weights in radians
    lambda: ((X - MU) ** 2 * torch.tensor([1.0, 0.0, 1.0])).mean(),  # a 0/1 mask
    lambda: ((X - MU).abs() * W_MIXED).mean(),  # not a square: not judged
    lambda: (torch.sigmoid(MU) ** 2 * W_MIXED).mean(),  # a bounded value's square
    lambda: ((X - MU) ** 2 * -2.0).mean() * -1.0,  # scalars pass the walk on: a plus in the end
])
def test_squares_weighted_by_non_negative_tensors_are_not(loss):
    assert _terms(loss()) == []


def test_the_weights_first_assignment_is_the_origin(tmp_path):
    from graddoctor.analysis.source import square_weight_origin

    script = tmp_path / "train.py"
    script.write_text(
        "lat_w = torch.cos(lat)\n"
        "lat_w = (lat_w / lat_w.mean()).view(1, 1, -1, 1)\n"
        "def weighted_mse(pred, target):\n"
        "    return ((pred - target) ** 2 * lat_w).mean()\n"
        "err = ((a - b) ** 2 * lat_w[None]).mean()\n")
    assert square_weight_origin(str(script)) == (1, "lat_w = torch.cos(lat)", "lat_w")
    script.write_text("loss = ((p - y) ** 2 * w).mean() + ((p - y) ** 2 * mask).mean()\n")
    assert square_weight_origin(str(script)) is None  # two names: no single origin


def test_the_rule_points_at_the_weights_origin(tmp_path):
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "w = torch.cos(lat)\n"
        "for x, y in data:\n"
        "    loss = ((model(x) - y) ** 2 * w).mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n")
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.loss_unbounded(term="weighted_square", op="MulBackward0", params=[1], line=5), line=5)
    t.backward(fresh=[0, 1], line=5)
    t.step(0, line=6)
    f = only(t, SLUG)
    assert f.location.line == 2 and "`w`" in f.message and f.evidence["term"] == "weighted_square"
