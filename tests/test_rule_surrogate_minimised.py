"""surrogate-minimised (GD261): what the ratio watcher (instrument/ratios.py) records of a
clipped surrogate's sign, and the rule over hand-written traces."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "surrogate-minimised"


def _faults(objective):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        policy = nn.Linear(4, 3)
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        states = torch.randn(16, 4)
        with torch.no_grad():
            rollout = Categorical(logits=policy(states))
            actions = rollout.sample()
            old = rollout.log_prob(actions)
        adv = torch.randn(16)
        for _ in range(2):
            ratio = (Categorical(logits=policy(states)).log_prob(actions) - old).exp()
            loss = objective(ratio, ratio.clamp(0.8, 1.2), adv)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e["fault"] for e in rec.trace if e.kind == "ratio_fault"]


def test_a_min_minimised_or_a_max_maximised_is_recorded_once():
    assert _faults(lambda r, c, a: torch.min(r * a, c * a).mean()) == ["minimised"]
    assert _faults(lambda r, c, a: 2.0 * torch.min(a * r, a * c).mean() + 1.0) == ["minimised"]
    assert _faults(lambda r, c, a: -torch.max(-a * r, -a * c).mean()) == ["minimised"]


def test_the_right_signs_and_other_mins_are_left_alone():
    assert _faults(lambda r, c, a: -torch.min(r * a, c * a).mean()) == []
    assert _faults(lambda r, c, a: torch.max(-a * r, -a * c).mean()) == []
    assert _faults(lambda r, c, a: torch.min(r * a, r * a * 0.5).mean()) == []  # no clamped copy
    assert _faults(lambda r, c, a: torch.min(r, c).mean()) == []  # no products


def test_the_rule_warns_at_the_surrogate():
    t = builder()
    t.put(ev.ratio_fault(fault="minimised", dist="Categorical", params=[0, 1], backward=16), line=14)
    t.backward(fresh=[0, 1], line=16)
    t.step(line=17)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 14 and "-torch.min" in f.fix
    t = builder()
    t.put(ev.ratio_fault(fault="cancels", dist="Categorical", params=[0, 1], backward=16), line=14)
    assert findings(t, SLUG) == []
