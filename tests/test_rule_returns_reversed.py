"""returns-reversed (GD274): policy-gradient weights (discounted returns) paired with the
log-probabilities in the reverse of the episode's order."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.distributions import Categorical

from graddoctor import events as ev
from graddoctor.instrument.returnorder import ReturnOrderWatcher, judge
from rule_traces import builder, findings, only

SLUG = "returns-reversed"


def _returns(rewards, gamma):
    out, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]  # the episode's order


def _normalised(seq):
    t = torch.tensor(seq)
    return ((t - t.mean()) / t.std()).tolist()


def test_returns_of_a_reward_per_step_read_backwards_are_told():
    right = _returns([1.0] * 30, 0.99)
    assert judge(right) is None
    assert judge(right[::-1]) == 0.99
    assert judge(_normalised(right[::-1])) is not None
    assert judge(_normalised(right)) is None


def test_a_two_valued_cost_and_a_sparse_success_are_told():
    rng = random.Random(0)
    cost = [rng.choice([-1.0, 0.0]) for _ in range(25)]
    assert judge(_returns(cost, 0.95)) is None and judge(_returns(cost, 0.95)[::-1]) is not None
    sparse = [0.0] * 15 + [1.0]
    assert judge(_returns(sparse, 0.9)) is None and judge(_returns(sparse, 0.9)[::-1]) is not None


def test_a_continuous_reward_or_an_undiscounted_constant_says_nothing():
    rng = random.Random(1)
    noisy = _returns([rng.gauss(0, 1) for _ in range(25)], 0.99)
    assert judge(noisy) is None and judge(noisy[::-1]) is None
    line = _returns([1.0] * 20, 1.0)
    assert judge(line) is None and judge(line[::-1]) is None
    assert judge(_returns([1.0] * 5, 0.9)[::-1]) is None  # too few steps


class _Finder:
    def user_frames(self, frame):
        while frame is not None:
            if frame.f_code.co_filename == __file__:
                yield frame
            frame = frame.f_back


class _Rec:
    def __init__(self):
        self.events = []
        self.finder = _Finder()

    def here(self, skip=2):
        return ("loc", len(self.events))

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        self.retired = True


class _Patcher:
    def __init__(self):
        self.undo = []

    def patch(self, owner, name, new):
        self.undo.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, new)

    def restore(self):
        for owner, name, old in reversed(self.undo):
            setattr(owner, name, old)


def _episode(reverse_back: bool, per_step: bool):
    torch.manual_seed(0)
    watcher = ReturnOrderWatcher(_Rec())
    patcher = _Patcher()
    watcher.install(patcher)
    try:
        policy = nn.Linear(3, 2)
        log_probs = []
        for _ in range(20):
            dist = Categorical(logits=policy(torch.randn(3)))
            log_probs.append(dist.log_prob(dist.sample()))
        returns, g = [], 0.0
        for r in [1.0] * 20:
            g = r + 0.97 * g
            returns.append(g)
        if reverse_back:
            returns.reverse()
        returns = torch.tensor(returns)
        if per_step:
            loss = torch.stack([-lp * ret for lp, ret in zip(log_probs, returns)]).sum()
        else:
            loss = -(torch.stack(log_probs) * returns).sum()
        watcher.describe_loss(loss)
    finally:
        patcher.restore()
    return watcher.rec.events


def test_the_watcher_records_unreversed_returns_stacked_or_step_by_step():
    for per_step in (False, True):
        made = _episode(False, per_step)
        assert [kind for kind, _ in made] == ["returns_order"]
        assert made[0][1]["steps"] == 20 and made[0][1]["name"] == "returns"
        assert _episode(True, per_step) == []


def _trace(name):
    t = builder(params=[0])
    t.put(ev.returns_order(steps=20, gamma=0.99, name=name), line=9)
    t.clear([0], line=10)
    t.backward(fresh=[0], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_names_the_weights_and_keeps_the_backward_without_a_source():
    f = only(_trace("returns"), SLUG)
    assert f.location.line == 9 and "`returns`" in f.message and "returns.insert(0, G)" in f.fix
    f = only(_trace(None), SLUG)
    assert "the weights" in f.message


def test_the_rule_is_silent_without_events():
    t = builder(params=[0])
    t.backward(fresh=[0], line=11)
    assert findings(t, SLUG) == []
