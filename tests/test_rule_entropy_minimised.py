"""entropy-minimised (GD259): what the entropy-sign watcher (instrument/entropysign.py) records
of an entropy bonus's sign, and the rule over hand-written traces."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.entropysign import signed
from rule_traces import builder, findings, only

SLUG = "entropy-minimised"


def _policy_gradient(bonus):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        for _ in range(2):
            dist = Categorical(logits=policy(torch.randn(16, 4)))
            pg = -(dist.log_prob(dist.sample()) * torch.randn(16)).mean()
            loss = bonus(pg, dist.entropy().mean())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e for e in rec.trace if e.kind == "entropy_sign"]


def test_an_entropy_added_to_a_policy_gradient_loss_is_recorded_once():
    found = _policy_gradient(lambda pg, h: pg + 0.01 * h)
    assert [(e["term"], e["dist"]) for e in found] == [("entropy", "Categorical")]
    assert _policy_gradient(lambda pg, h: pg - 0.01 * h) == []
    assert _policy_gradient(lambda pg, h: pg + 0.01 * -h) == []
    assert _policy_gradient(lambda pg, h: pg + h * h) == []  # a product of two tensors: not judged


def test_an_entropy_minimised_without_a_policy_gradient_term_is_left_alone():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = Categorical(logits=model(torch.randn(8, 4))).entropy().mean()
        loss.backward()
        opt.step()
    assert [e for e in rec.trace if e.kind == "entropy_sign"] == []


def _sac(sign):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        actor = nn.Linear(4, 4)
        opt = torch.optim.SGD(actor.parameters(), lr=0.1)
        mu, log_std = actor(torch.randn(8, 4)).chunk(2, -1)
        pi = Normal(mu, log_std.exp())
        u = pi.rsample()
        prior = Normal(torch.zeros(2), torch.ones(2))
        loss = (sign * 0.2 * pi.log_prob(u).sum(-1) - prior.log_prob(u).sum(-1) - u.sum(-1)).mean()
        loss.backward()
        opt.step()
    return [e["term"] for e in rec.trace if e.kind == "entropy_sign"]


def test_the_log_probability_of_the_own_sample_must_not_be_subtracted():
    assert _sac(-1.0) == ["log_prob"]
    assert _sac(1.0) == []  # the prior's log_prob of the sample: another distribution's


def test_the_signed_walk_follows_negations_and_constant_factors():
    x = torch.randn(3, requires_grad=True)
    term = x.exp().sum()
    loss = 1.0 - 2.0 * (-term) / 4.0
    assert signed(loss.grad_fn, {term.grad_fn}) == {term.grad_fn: 1.0}
    assert signed((term - loss).grad_fn, {term.grad_fn}) == {}  # reached with both signs


def test_the_rule_warns_at_the_term_with_its_own_fix():
    t = builder()
    t.put(ev.entropy_sign(term="entropy", dist="Categorical"), line=14)
    t.backward(fresh=[0, 1], line=15)
    t.step(line=16)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 14 and "Categorical" in f.message
    t = builder()
    t.put(ev.entropy_sign(term="log_prob", dist="Normal"), line=14)
    f = only(t, SLUG)
    assert "alpha * log_prob" in f.fix
    assert findings(builder(), SLUG) == []
