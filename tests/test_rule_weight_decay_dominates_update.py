"""weight-decay-dominates-update (GD168): hand-written traces of decay_share events, and the
watcher that measures them on real optimizers."""

from __future__ import annotations

import pytest
import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.decay import MEASURED, DecayShareWatcher, _weighted_median
from rule_traces import P, findings, fold_hard
from graddoctor.trace import TraceBuilder

SLUG = "weight-decay-dominates-update"


def _trace(ratios=(30.0, 25.0, 28.0), cls="Adam", decay=1.0, lr=1e-3, decoupled=False,
           group=0, more=()):
    t = TraceBuilder()
    t.optimizer(0, P, line=3, cls=cls)
    for i in range(4):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 12)
        t.step(0, line=12)
        if i == 2:
            t.put(ev.decay_share(opt=0, cls=cls, group=group, weight_decay=decay, lr=lr,
                                 decoupled=decoupled, steps=[1, 2, 3][:len(ratios)],
                                 ratios=list(ratios)))
            for made in more:
                t.put(made)
    return t.trace


def test_coupled_adam_is_a_warning_at_the_construction():
    found = findings(_trace(), SLUG)
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "Adam adds weight_decay=1 × p" in f.message and "25× to 30×" in f.message
    assert "lr × sign(p)" in f.message and "AdamW" in f.fix
    assert f.evidence["ratios"] == [30.0, 25.0, 28.0] and f.evidence["groups"] == [0]


def test_sgd_says_shrinkage_and_names_sgds_range():
    f = findings(_trace(cls="SGD", lr=0.01, decay=0.5), SLUG)[0]
    assert "shrinkage" in f.message and "5e-4" in f.fix and "AdamW" not in f.fix


def test_decoupled_decay_is_judged_against_the_adam_step():
    f = findings(_trace(cls="AdamW", decoupled=True, decay=500.0, lr=1e-4), SLUG)[0]
    assert "decoupled weight_decay=500" in f.message and "0.01 to 0.1" in f.fix


def test_a_second_group_is_named():
    other = ev.decay_share(opt=0, cls="Adam", group=1, weight_decay=1e-4, lr=1e-3,
                           decoupled=False, steps=[1, 2, 3], ratios=[0.1, 0.1, 0.1])
    f = findings(_trace(more=[other]), SLUG)[0]
    assert "of param group 0" in f.message


@pytest.mark.parametrize("case", [
    dict(ratios=(30.0, 9.0, 30.0)),  # one update the loss's gradient still held its own
    dict(ratios=(30.0, 30.0)),  # too few updates measured
    dict(decay=1e-3, ratios=(500.0, 500.0, 500.0)),  # converged: tiny grads, a usual decay
    dict(cls="SGD", decay=5e-4, ratios=(50.0, 50.0, 50.0)),
    dict(cls="SGD", decay=2.0, lr=0.1),  # lr × weight_decay ≥ 0.1: hyperparameter-out-of-range's
    dict(cls="AdamW", decoupled=True, decay=100.0, lr=1e-3),  # the same, decoupled
    dict(cls="AdamW", decoupled=True, decay=0.05, ratios=(0.01, 0.01, 0.01)),
])
def test_silent(case):
    assert findings(_trace(**case), SLUG) == []


def test_folding_keeps_the_finding():
    trace = _trace()
    assert [f.message for f in findings(fold_hard(trace), SLUG)] == \
        [f.message for f in findings(trace, SLUG)]


def test_weighted_median_follows_the_elements():
    # a large tensor with a small ratio outweighs two small ones with a large ratio
    assert _weighted_median([100.0, 100.0, 1.0], [10, 10, 1000]) == 1.0
    assert _weighted_median([100.0, 1.0], [600, 400]) == 100.0
    assert _weighted_median([], []) is None


class _Rec:
    """What the watcher reads of the recorder: the step count, emitted events, errors, the
    optimizers registered, and the topics it subscribes to and retires from."""

    def __init__(self):
        self.events, self.errors = [], []
        self.opt_params: dict = {}
        self.retired: list = []

        class _Progress:
            steps = 0
        self.progress = _Progress()

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        self.errors.append((where, exc))

    def subscribe(self, topic, subscriber):
        pass

    def retire(self, topic, subscriber):
        self.retired.append(subscriber)

    def resume(self, topic, subscriber):
        pass


def _measure(optimizer, params, grads, steps=MEASURED):
    rec = _Rec()
    watcher = DecayShareWatcher(rec)
    for _ in range(steps):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        watcher.before_step(0, optimizer)
        rec.progress.steps += 1
    assert rec.errors == []
    return rec.events


def test_the_watcher_measures_coupled_and_decoupled_decay():
    w = torch.nn.Parameter(torch.full((4, 25), 0.5))  # norm 5, 100 elements
    grads = [torch.full((4, 25), 0.01)]  # norm 0.1
    events = _measure(torch.optim.Adam([w], lr=1e-3, weight_decay=0.2), [w], grads)
    assert len(events) == 1
    kind, data = events[0]
    assert kind == "decay_share" and not data["decoupled"] and data["steps"] == [1, 2, 3]
    assert data["ratios"] == [pytest.approx(0.2 * 5 / 0.1)] * 3
    kind, data = _measure(torch.optim.AdamW([w], lr=1e-3, weight_decay=40.0), [w], grads)[0]
    assert data["decoupled"] and data["ratios"] == [pytest.approx(40.0 * 0.5)] * 3


def test_the_watcher_leaves_groups_without_decay_and_stops_after_the_measured_updates():
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    assert _measure(optimizer, [w], [torch.ones(3)]) == []
    decayed = torch.optim.SGD([w], lr=0.1, weight_decay=0.1)
    assert len(_measure(decayed, [w], [torch.ones(3)], steps=MEASURED + 3)) == 1


def test_a_zero_gradient_says_nothing():
    w = torch.nn.Parameter(torch.ones(3))
    assert _measure(torch.optim.Adam([w], weight_decay=1.0), [w], [torch.zeros(3)]) == []
