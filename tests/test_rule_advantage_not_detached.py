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
