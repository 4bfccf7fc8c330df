"""policy-gradient-reversed (GD317): what the policy-sign watcher (instrument/policysign.py)
records of a policy-gradient term's sign against the critic's R - V in the same loss, and the
rule, which speaks only where the script names the weight a reward's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.policysign import PolicySignWatcher, _orientation, picked_log_softmax
from graddoctor.rules import find_rule

SLUG = "policy-gradient-reversed"


class _AC(nn.Module):
    def __init__(self):
        super().__init__()
        self.pi, self.v = nn.Linear(4, 3), nn.Linear(4, 1)

    def forward(self, x):
        return Categorical(logits=self.pi(x)), self.v(x).squeeze(-1)


def _run(update, steps=2):
    """The events and findings of ``steps`` updates ``update(logp, values, rewards, opt)`` makes
    (its loss, backward and step: the rule reads the lines of the backward's function)."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        model = _AC()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            obs = torch.randn(32, 4)
            dist, values = model(obs)
            actions = dist.sample()
            rewards = (actions == obs[:, :3].argmax(-1)).float()
            update(dist.log_prob(actions), values, rewards, opt)
    events = [e for e in rec.trace if e.kind == "policy_sign"]
    return events, list(find_rule(SLUG)().check(Analysis(rec.trace)))


def _forgotten_minus(logp, values, rewards, opt):
    advantage = rewards - values
    actor_loss = (logp * advantage.detach()).mean()
    loss = actor_loss + 0.5 * advantage.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _with_minus(logp, values, rewards, opt):
    advantage = rewards - values
    actor_loss = -(logp * advantage.detach()).mean()
    loss = actor_loss + 0.5 * advantage.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_a_policy_term_minimised_along_the_critics_advantage_is_found_at_its_line():
    events, found = _run(_forgotten_minus)
    assert [(e["weight"], e["sign"], e["critic"]) for e in events] == [("advantage", "minimised", "square")]
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    f = found[0]
    assert f.location.line == _forgotten_minus.__code__.co_firstlineno + 2  # actor_loss = ...
    assert "actor_loss = (logp * advantage.detach()).mean()" in f.message
    assert f.fix.startswith("negate")
    assert _run(_with_minus) == ([], [])


def _value_minus_return(logp, values, rewards, opt):
    advantages = values - rewards
    actor_loss = -(logp * advantages.detach()).mean()
    loss = actor_loss + F.mse_loss(values, rewards)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _value_minus_return_minimised(logp, values, rewards, opt):
    advantages = values - rewards
    actor_loss = (logp * advantages.detach()).mean()
    loss = actor_loss + F.mse_loss(values, rewards)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_a_difference_written_the_other_way_points_at_the_advantage():
    events, found = _run(_value_minus_return)
    assert [(e["weight"], e["sign"], e["critic"]) for e in events] == [("cost", "maximised", "mse_loss")]
    assert [f.location.line for f in found] == [_value_minus_return.__code__.co_firstlineno + 1]
    # minimised, log_prob * (V - R) is the same gradient as -log_prob * (R - V): right
    assert _run(_value_minus_return_minimised) == ([], [])


def _normalised(sign):
    def loss_of(logp, values, rewards, opt):
        adv = (rewards - values).detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss = sign * (logp * adv).mean() + F.smooth_l1_loss(values, rewards)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss_of


def test_a_normalised_advantage_is_oriented_by_its_correlation():
    events, found = _run(_normalised(1.0))
    assert [e["weight"] for e in events] == ["advantage"] and len(found) == 1
    assert _run(_normalised(-1.0)) == ([], [])


def test_no_critic_and_standardised_returns_say_nothing():
    def reinforce(logp, values, rewards, opt):
        returns = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        loss = (logp * returns).sum()  # REINFORCE: the sign of the data is not in the graph
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert _run(reinforce) == ([], [])


def test_reinforce_without_a_critic_minimised_along_positive_returns_is_found():
    def reinforce(logp, values, rewards, opt):
        returns = rewards + 0.1  # all positive, no baseline
        loss = (logp * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    events, found = _run(reinforce)
    assert [(e["critic"], e["weight"], e["sign"]) for e in events] == [("none", "return", "minimised")]
    assert len(found) == 1 and "no critic or baseline" in found[0].message
    assert found[0].location.line == reinforce.__code__.co_firstlineno + 2
    assert found[0].fix.startswith("negate")


def test_reinforce_from_a_gathered_log_softmax_is_read_without_torch_distributions():
    def gathered(logp, values, rewards, opt, sign=1.0):
        obs = torch.randn(16, 3)
        logits = obs @ torch.ones(3, 3, requires_grad=True)
        actions = torch.randint(0, 3, (16,))
        log_probs = F.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
        reward = torch.rand(16) + 0.2
        loss = sign * (log_probs * reward).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    events, found = _run(gathered)
    assert [e["dist"] for e in events] == ["log_softmax"] and len(found) == 1
    assert _run(lambda *a: gathered(*a, sign=-1.0)) == ([], [])


def test_picked_log_softmax_needs_the_class_axis():
    x = torch.randn(4, 5, requires_grad=True)
    idx = torch.randint(0, 4, (1, 5))
    assert picked_log_softmax((l := F.log_softmax(x, -1).gather(1, idx[:, :4].T[:, :1])).grad_fn,
                              type(l.grad_fn).__name__)
    over_rows = F.log_softmax(x, -1).gather(0, idx)
    assert not picked_log_softmax(over_rows.grad_fn, type(over_rows.grad_fn).__name__)
    plain = x.gather(1, idx[:, :4].T[:, :1])
    assert not picked_log_softmax(plain.grad_fn, type(plain.grad_fn).__name__)


def test_returns_minimised_needs_positive_varied_weights():
    w = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    ok = PolicySignWatcher._returns_minimised
    assert ok([(1.0, w(0.0, 1.0, 0.5), "Categorical")])
    assert not ok([(-1.0, w(0.0, 1.0, 0.5), "Categorical")])  # the minus is there
    assert not ok([(1.0, w(-0.5, 1.0, 0.5), "Categorical")])  # a baseline subtracted
    assert not ok([(1.0, w(2.0, 2.0, 2.0), "Categorical")])  # one value: a scaled likelihood
    assert not ok([(1.0, w(3.0), "Categorical")])


def test_a_cost_with_a_learned_baseline_is_recorded_but_the_names_keep_the_rule_silent():
    def routing(logp, values, rewards, opt):
        cost = 1.0 - rewards
        bl_val = values
        reinforce_loss = ((cost - bl_val).detach() * logp).mean()
        loss = reinforce_loss + F.mse_loss(bl_val, cost)
        opt.zero_grad()
        loss.backward()
        opt.step()
    events, found = _run(routing)
    assert len(events) == 1 and found == []


def test_one_number_per_step_is_compared_as_a_multiset():
    def per_step(logp, values, rewards, opt):
        policy_losses, value_losses = [], []
        for log_prob, value, r in zip(logp[:8], values[:8], rewards[:8]):
            advantage = r - value.item()
            policy_losses.append(log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value.view(1), r.view(1)))
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    events, found = _run(per_step)
    assert [e["weight"] for e in events] == ["advantage"] and len(found) == 1


def test_orientation():
    d = torch.tensor([0.5, -0.2, 1.0, 0.1], dtype=torch.float64)
    assert _orientation([d.clone()], [d]) == 1.0
    assert _orientation([-d], [d]) == -1.0
    assert _orientation([2 * d + 1], [d]) == 1.0  # an affine normalisation keeps the orientation
    sym = torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=torch.float64)
    assert _orientation([sym.sort().values], [sym.sort().values]) == 1.0  # paired: still known
    singles = [torch.tensor([v], dtype=torch.float64) for v in (1.0, -1.0)]
    assert _orientation(singles, singles) == 0.0  # symmetric multisets: both orientations fit
    assert _orientation([torch.zeros(4, dtype=torch.float64)], [d]) == 0.0
