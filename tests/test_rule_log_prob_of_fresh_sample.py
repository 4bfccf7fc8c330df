"""log-prob-of-fresh-sample (GD156): what the fresh-sample watcher (instrument/freshsample.py)
records of a policy-gradient loss on the log-probability of a second, unused sample, and the
rule over hand-written traces."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "log-prob-of-fresh-sample"


def _recorded(body, steps=2):
    """The ``fresh_sample_scored`` events' dist of ``body(logits)``'s loss over ``steps`` updates."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        for _ in range(steps):
            loss = body(policy(torch.randn(16, 4)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e["dist"] for e in rec.trace if e.kind == "fresh_sample_scored"]


def _reward(actions):
    return (torch.as_tensor(actions) == 1).float()


def test_a_return_weighted_log_prob_of_a_second_unused_sample_is_recorded_once():
    def bad(logits):
        dist = Categorical(logits=logits)
        actions = dist.sample()
        reward = _reward(actions.tolist())
        return -(dist.log_prob(dist.sample()) * (reward - reward.mean())).mean()
    assert _recorded(bad) == ["Categorical"]

    def rebuilt(logits):  # a second distribution from the same logits, sampled again
        reward = _reward(Categorical(logits=logits).sample().tolist())
        policy = Categorical(logits=logits)
        return -(policy.log_prob(policy.sample()) * reward).sum()
    assert _recorded(rebuilt) == ["Categorical"]

    def gaussian(logits):
        dist = Normal(logits, torch.ones_like(logits))
        ret = -dist.sample().pow(2).sum(-1)
        return -(dist.log_prob(dist.sample()).sum(-1) * ret).mean()
    assert _recorded(gaussian) == ["Normal"]


def test_the_action_taken_a_used_second_sample_and_entropy_estimates_are_left_alone():
    def taken(logits):
        dist = Categorical(logits=logits)
        actions = dist.sample()
        return -(dist.log_prob(actions) * _reward(actions.tolist())).mean()
    assert _recorded(taken) == []

    def sampled_baseline(logits):
        dist = Categorical(logits=logits)
        baseline = _reward(dist.sample())
        actions = dist.sample()
        return -(dist.log_prob(actions) * (_reward(actions) - baseline)).mean()
    assert _recorded(sampled_baseline) == []

    def entropy_bonus(logits):  # beside a policy gradient on the action taken
        dist = Categorical(logits=logits)
        actions = dist.sample()
        pg = -(dist.log_prob(actions) * _reward(actions)).mean()
        return pg + 0.01 * dist.log_prob(dist.sample()).mean()
    assert _recorded(entropy_bonus) == []

    def own_weight(logits):  # the entropy's score-function gradient
        dist = Categorical(logits=logits)
        _reward(dist.sample().tolist())
        logp = dist.log_prob(dist.sample())
        return (logp * (1 + logp.detach())).mean()
    assert _recorded(own_weight) == []

    def unweighted(logits):
        dist = Categorical(logits=logits)
        _reward(dist.sample().tolist())
        return -dist.log_prob(dist.sample()).mean()
    assert _recorded(unweighted) == []

    def different_parameters(logits):  # two distributions, each sampled once
        first, second = Categorical(logits=logits), Categorical(logits=logits * 2)
        reward = _reward(first.sample())
        return -(second.log_prob(second.sample()) * reward).mean()
    assert _recorded(different_parameters) == []

    def no_grad(logits):
        dist = Categorical(logits=logits)
        reward = _reward(dist.sample())
        with torch.no_grad():
            extra = dist.sample()
        return -(dist.log_prob(extra) * reward).mean()
    assert _recorded(no_grad) == []


def test_the_mode_is_gone_after_the_backward_and_after_the_run():
    depth = torch._C._len_torch_function_stack()
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        dist = Categorical(logits=policy(torch.randn(8, 4)))
        dist.sample()
        logp = dist.log_prob(dist.sample())
        assert torch._C._len_torch_function_stack() > depth  # the window is open
        (logp * torch.randn(8)).sum().backward()
        assert torch._C._len_torch_function_stack() == depth
        dist = Categorical(logits=policy(torch.randn(8, 4)))
        dist.sample()
        dist.sample()
    assert torch._C._len_torch_function_stack() == depth


def test_the_rule_warns_at_the_log_prob_with_the_action_taken_as_the_fix():
    t = builder()
    t.put(ev.fresh_sample_scored(dist="Categorical", params=[0, 1], acted=10, sampled=12,
                                 backward=14), line=12)
    t.backward(fresh=[0, 1], line=14)
    t.step(line=15)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "log_prob(" in f.fix and "line 10" in f.message and "Categorical" in f.message
    t = builder()
    t.put(ev.fresh_sample_scored(dist="Categorical", params=[5], acted=10, sampled=12,
                                 backward=14), line=12)
    assert findings(t, SLUG) == []  # no optimizer steps them
