"""advantage-not-detached (GD247): the log_prob watcher's advantage_grad events
(instrument/policygrad.py), and the rule's check that a step applies what the weight carried."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributions import Categorical

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "advantage-not-detached"


def _events(detach: bool, entropy_only: bool = False):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        body, pi, v = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 1)
        opt = torch.optim.SGD([*body.parameters(), *pi.parameters(), *v.parameters()], lr=0.1)
        for _ in range(2):
            h = torch.tanh(body(torch.randn(16, 4)))
            dist = Categorical(logits=pi(h))
            logp = dist.log_prob(dist.sample())
            value = v(h).squeeze(-1)
            adv = torch.randn(16) - value
            if entropy_only:  # probs * log_prob: both factors reach the same parameters
                loss = -(dist.probs * dist.logits).sum(-1).mean() + adv.pow(2).mean()
            else:
                loss = -(logp * (adv.detach() if detach else adv)).mean() + adv.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    names = {id(p): n for n, p in (("v.weight", v.weight), ("v.bias", v.bias))}
    found = [e for e in rec.trace if e.kind == "advantage_grad"]
    return found, {names.get(id(rec.tensors.refs[p]())) for e in found for p in e["params"]}


def test_an_undetached_advantage_names_the_critics_parameters_once_per_line():
    found, names = _events(detach=False)
    assert len(found) == 1 and names == {"v.weight", "v.bias"}  # not the shared body


def test_a_detached_advantage_and_an_entropy_record_nothing():
    assert _events(detach=True)[0] == []
    assert _events(detach=False, entropy_only=True)[0] == []


def _trace(clear_before_step: bool):
    t = builder(params=[0, 1, 2])
    t.put(ev.advantage_grad(params=[2]), 12)
    t.clear([0, 1, 2], line=11)
    t.backward(fresh=[0, 1, 2], line=12)
    if clear_before_step:
        t.clear([2], line=13)
    t.step(0, line=14)
    return t


def test_the_finding_needs_a_step_that_applies_the_weights_gradient():
    f = only(_trace(clear_before_step=False), SLUG)
    assert f.location.line == 12 and "detach" in f.fix
    assert findings(_trace(clear_before_step=True), SLUG) == []


@pytest.mark.compile
def test_log_prob_inside_a_fullgraph_compiled_function_is_seen_through():
    """The log_prob wrapper is inlined by Dynamo and traces only the original (inlinable.py):
    a compiled policy loss with fullgraph=True compiles and runs under the instrumentation."""
    torch._dynamo.reset()
    net = nn.Linear(4, 3)

    @torch.compile(fullgraph=True)
    def policy_loss(s, a, ret):
        return -(Categorical(logits=net(s)).log_prob(a) * ret).mean()

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        loss = policy_loss(torch.randn(8, 4), torch.randint(0, 3, (8,)), torch.randn(8))
        loss.backward()
    assert net.weight.grad is not None
    torch._dynamo.reset()


def _variational_events(detach: bool, analytic_kl: bool = False):
    """A Bernoulli-latent autoencoder whose score term log q(z) is weighted by the learning
    signal log p(x | z) + log p(z) - log q(z) - b: log-probabilities on both factors."""
    from torch.distributions import Bernoulli
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        enc, dec, base = nn.Linear(6, 3), nn.Linear(3, 6), nn.Linear(6, 1)
        prior = nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([*enc.parameters(), *dec.parameters(), *base.parameters(), prior],
                              lr=0.1)
        for _ in range(2):
            x = (torch.rand(16, 6) < 0.5).float()
            q = Bernoulli(logits=enc(x))
            z = q.sample()
            log_q = q.log_prob(z).sum(-1)
            log_p = Bernoulli(logits=prior.expand_as(z)).log_prob(z).sum(-1) \
                + Bernoulli(logits=dec(z)).log_prob(x).sum(-1)
            b = base(x).squeeze(-1)
            if analytic_kl:  # q * (log q - log p) over both values: no score term
                ones = torch.ones_like(z)
                lq1, lp1 = q.log_prob(ones), Bernoulli(logits=prior.expand_as(z)).log_prob(ones)
                loss = (lq1.exp() * (lq1 - lp1)).sum(-1).mean() - log_p.mean()
            else:
                signal = log_p - log_q - b
                loss = -((signal.detach() if detach else signal) * log_q).mean() \
                    - log_p.mean() + (log_p - log_q - b).detach().pow(2).mean() + b.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    names = {id(p): n for n, p in (("dec.weight", dec.weight), ("prior", prior),
                                   ("base.weight", base.weight), ("enc.weight", enc.weight))}
    found = [e for e in rec.trace if e.kind == "advantage_grad"]
    return found, {names.get(id(rec.tensors.refs[p]())) for e in found for p in e["params"]}


def test_a_variational_learning_signal_not_detached_names_decoder_prior_and_baseline():
    found, names = _variational_events(detach=False)
    assert len(found) == 1
    assert {"dec.weight", "prior", "base.weight"} <= names and "enc.weight" not in names


def test_a_detached_learning_signal_and_an_analytic_kl_record_nothing():
    assert _variational_events(detach=True)[0] == []
    assert _variational_events(detach=False, analytic_kl=True)[0] == []


def test_the_score_weight_line_follows_the_signal_back_to_where_it_was_made(tmp_path):
    from graddoctor.analysis.source import score_weight_line
    path = tmp_path / "nvil.py"
    path.write_text(
        "def train(q, z, log_p, b):\n"
        "    log_q = q.log_prob(z).sum(-1)\n"
        "    signal = log_p - log_q - b\n"
        "    signal = (signal - signal.mean()) / 2.0\n"
        "    loss = -(signal * log_q).mean()\n"
        "    loss.backward()\n")
    assert score_weight_line(str(path), 6) == (3, "signal = log_p - log_q - b")
