"""log-det-sign-reversed (GD271): the scale terms of instrument/lossterms.py and the rule over
hand-written traces."""

from __future__ import annotations

import pytest
import torch

from graddoctor import events as ev
from graddoctor.instrument.lossterms import scale_terms
from rule_traces import builder, findings, only

SLUG = "log-det-sign-reversed"

S = torch.randn(8, 2, requires_grad=True)
MU = torch.randn(8, 2, requires_grad=True)
X = torch.randn(8, 2)


def _found(loss):
    return [(held, sign) for _arg, held, _exp, sign in scale_terms(loss.grad_fn)]


def _flow(log_det_sign):
    z = X * torch.exp(S) + MU
    log_pz = -0.5 * (z ** 2).sum(1)
    return -(log_pz + log_det_sign * S.sum(1)).mean()


def _glow(sign):
    scale = torch.sigmoid(S + 2)
    z = (X + MU) * scale
    return -(-0.5 * (z ** 2).sum(1) + sign * torch.log(scale).sum(1)).mean()


def _sigma_nll(sign):
    sigma = torch.nn.functional.softplus(S)
    return (sign * torch.log(sigma) + ((X - MU) / sigma) ** 2).mean()


def _inverse_flow(s):
    """z = (x - mu) * exp(-s): its log-det is -sum(s), and the NLL adds sum(s); here subtracted."""
    return (0.5 * (((X - MU) * torch.exp(-s)) ** 2).sum(1) - s.sum(1)).mean()


@pytest.mark.parametrize("loss, found", [
    (lambda: _flow(-1.0), [(1.0, 1.0)]),  # -(log p(z) - logdet)
    (lambda: (-0.5 * S + 0.5 * (X - MU) ** 2 * torch.exp(-S)).mean(), [(-1.0, -1.0)]),
    (lambda: (0.5 * torch.exp(S) * (X - MU) ** 2 + 0.5 * S).mean(), [(1.0, 1.0)]),
    (lambda: _inverse_flow(torch.tanh(S)), [(-1.0, -1.0)]),
    (lambda: _glow(-1.0), [(1.0, 1.0)]),  # log(scale) subtracted from log p(z)
    (lambda: _sigma_nll(-1.0), [(-1.0, -1.0)]),  # -log(sigma) + ((y - mu) / sigma)**2
    # the log-variance negated, its precision written as a division by exp(logvar)
    (lambda: (-0.5 * S + 0.5 * (X - MU) ** 2 / S.exp()).mean(), [(-1.0, -1.0)]),
])
def test_a_log_scale_pulled_the_same_way_twice_is_found(loss, found):
    assert _found(loss()) == found


@pytest.mark.parametrize("loss", [
    lambda: _flow(1.0),  # -(log p(z) + logdet)
    lambda: _glow(1.0),
    lambda: _sigma_nll(1.0),
    lambda: (-torch.log(torch.softmax(MU, 1)[:, 0]) + 0.1 * (torch.softmax(MU, 1) * torch.log_softmax(MU, 1)).sum(1)).mean(),
    lambda: (0.5 * S + 0.5 * (X - MU) ** 2 * torch.exp(-S)).mean(),  # Gaussian NLL
    lambda: (0.5 * S + 0.5 * (X - MU) ** 2 / S.exp()).mean(),  # the same, dividing by exp(s)
    lambda: (0.5 * S + (X - MU) ** 2 / (2 * torch.exp(S))).mean(),  # ... by 2 * exp(s)
    lambda: (S + (X - MU).abs() * torch.exp(-S)).mean(),  # Laplace NLL
    lambda: (torch.exp(-S[:, 0]) * ((X - MU) ** 2).mean() + S[:, 0]).mean(),  # learned task weights
    lambda: -0.5 * torch.sum(1 + S - MU.pow(2) - S.exp()),  # the KL, right sign
    # the KL with its sign flipped is loss-unbounded-below's, reparameterisation included
    lambda: 0.5 * torch.sum(1 + S - MU.pow(2) - S.exp()) + ((MU + X * torch.exp(0.5 * S)) ** 2).sum(),
    lambda: (torch.exp(S) - X * S).mean(),  # a Poisson NLL
])
def test_right_signs_and_other_owners_are_not(loss):
    assert _found(loss()) == []


def _trace(params):
    t = builder(params=[0, 1])
    t.clear([0, 1], line=10)
    t.put(ev.log_scale_reversed(linear=1.0, exp=1.0, op="TanhBackward0", params=list(params),
                                bounded=True, line=11), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_the_scales_parameters_are_stepped():
    f = only(_trace([1]), SLUG)
    assert f.location.line == 11 and f.evidence["bounded"] is True and "saturates" in f.message


def test_the_rule_is_silent_on_tensors_no_optimizer_steps():
    assert findings(_trace([7]), SLUG) == []


def test_a_flow_summing_its_log_dets_with_a_minus_is_pointed_at_the_sum(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "flow.py"
    script.write_text(
        "import torch\n"                                                  # 1
        "log_det = torch.zeros(8)\n"                                      # 2
        "for layer in layers:\n"                                          # 3
        "    z, ld = layer(z)\n"                                          # 4
        "    log_det = log_det - ld\n"                                    # 5
        "loss = -(prior.log_prob(z) + log_det).mean()\n"                  # 6
        "loss.backward()\n")                                              # 7
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.log_scale_reversed(linear=1.0, exp=1.0, op="MulBackward0", params=[0, 1],
                                bounded=False, line=7), line=7)
    t.backward(fresh=[0, 1], line=7)
    t.step(0, line=8)
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 5 and "log_det = log_det - ld" in f.message
    # the loss itself subtracting the log-det stays the line to change
    script.write_text(script.read_text().replace("    log_det = log_det - ld\n", "    log_det += ld\n")
                      .replace("+ log_det).mean()", "- log_det).mean()"))
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 6


def test_a_minus_sum_is_pointed_at_when_the_log_det_is_added_in_a_called_function(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "flow.py"
    script.write_text(
        "import torch\n"                                                  # 1
        "def log_prob(x):\n"                                              # 2
        "    log_det = torch.zeros(8)\n"                                  # 3
        "    for layer in layers:\n"                                      # 4
        "        x, ld = layer(x)\n"                                      # 5
        "        log_det = log_det - ld\n"                                # 6
        "    return -0.5 * (x ** 2).sum(1) + log_det\n"                   # 7
        "loss = -log_prob(batch).mean()\n"                                # 8
        "loss.backward()\n")                                              # 9
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.log_scale_reversed(linear=1.0, exp=1.0, op="MulBackward0", params=[0, 1],
                                bounded=False, line=9), line=9)
    t.backward(fresh=[0, 1], line=9)
    t.step(0, line=10)
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 6
    # without any place adding the log-det, the loss's line stays the line to change
    script.write_text(script.read_text().replace("+ log_det\n", "- log_det\n"))
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 8


def _gaussian_kl(log_sign, scale=None):
    sigma = torch.nn.functional.softplus(S) if scale is None else scale
    return (log_sign * torch.log(sigma) + 0.5 * (sigma ** 2 + MU ** 2) - 0.5).sum()


def test_a_gaussian_kl_with_its_log_sigma_flipped_is_found_through_the_power():
    found = scale_terms(_gaussian_kl(1.0).grad_fn)
    assert [(held, sign) for _arg, held, _exp, sign in found] == [(1.0, 1.0)]
    assert type(found[0][2]).__name__ == "PowBackward0"
    assert _found(_gaussian_kl(1.0, scale=S.exp())) == [(1.0, 1.0)]


@pytest.mark.parametrize("loss", [
    lambda: _gaussian_kl(-1.0),  # the KL, right sign
    lambda: _gaussian_kl(-1.0, scale=S.exp()),
    # a Gaussian NLL: sigma ** 2 divides the squared error, it is not held linearly
    lambda: (torch.log(torch.nn.functional.softplus(S)) + (X - MU) ** 2
             / (2 * torch.nn.functional.softplus(S) ** 2)).mean(),
    lambda: (torch.log(S.exp()) + (X - MU) ** 2 / (2 * S.exp() ** 2)).mean(),
])
def test_a_log_sigma_balanced_by_its_power_or_a_division_is_not(loss):
    assert _found(loss()) == []


def test_the_power_form_points_at_the_statement_with_the_log_and_the_square(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "bnn.py"
    script.write_text(
        "import torch\n"                                                              # 1
        "def kl(mu, rho):\n"                                                          # 2
        "    sigma = torch.nn.functional.softplus(rho)\n"                             # 3
        "    return (sigma.log() + (sigma ** 2 + mu ** 2) / 2 - 0.5).sum()\n"         # 4
        "loss = nll + kl(mu, rho) / n\n"                                              # 5
        "loss.backward()\n")                                                          # 6
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.log_scale_reversed(linear=1.0, exp=1.0, op="SoftplusBackward0", params=[1],
                                bounded=False, line=6, power=True), line=6)
    t.backward(fresh=[0, 1], line=6)
    t.step(0, line=7)
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 4 and "+log(sigma)" in f.message and "sigma ** 2" in f.message
    assert "log(s0) - log(sigma)" in f.fix and f.evidence["power"] == 1.0
    script.write_text(script.read_text().replace("sigma ** 2", "sigma.pow(2)"))
    f, = find_rule(SLUG)().check(Analysis(t.trace))
    assert f.location.line == 4
