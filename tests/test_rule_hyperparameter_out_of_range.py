"""hyperparameter-out-of-range (GD131): hand-written traces, and the ``hyper`` settings the
optimizer watcher records at construction."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "hyperparameter-out-of-range"


def _run(cls, hyper, lrs=(0.1,), steps=3):
    t = TraceBuilder()
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls=cls, params=list(P), lrs=list(lrs), hyper=list(hyper)), 3)
    for _ in range(steps):
        t.backward(fresh=P, line=8)
        t.put(ev.step_begin(opt=0, norm_pids=P, norms=[1.0, 1.0], lrs=list(lrs)), 9)
        t.step(line=9)
    return t


def test_swapped_adam_betas_are_a_warning_at_the_construction():
    f = only(_run("Adam", [{"betas": [0.999, 0.9], "eps": 1e-8, "weight_decay": 0}]), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "swapped" in f.message and f.evidence["settings"] == ["betas"]


def test_betas_that_keep_the_step_bounded_are_silent():
    for betas in ([0.9, 0.999], [0.5, 0.999], [0.0, 0.99], [0.9, 0.9], [0.95, 0.999]):
        assert findings(_run("AdamW", [{"betas": betas, "weight_decay": 0.01}]), SLUG) == []
    # beta1 > beta2 alone is not the bound: beta1² < beta2 keeps the step bounded
    assert findings(_run("Adam", [{"betas": [0.9, 0.85]}]), SLUG) == []
    assert only(_run("Adam", [{"betas": [0.9, 0.8]}]), SLUG)


def test_momentum_of_one_or_more():
    assert only(_run("SGD", [{"momentum": 1.5, "dampening": 0}]), SLUG).severity is Severity.ERROR
    assert only(_run("SGD", [{"momentum": 1.0, "dampening": 0}]), SLUG).severity is Severity.WARNING
    assert findings(_run("SGD", [{"momentum": 0.99, "dampening": 0}]), SLUG) == []
    assert only(_run("SGD", [{"momentum": 0.9, "dampening": 1.0}]), SLUG).severity is Severity.ERROR
    assert only(_run("RMSprop", [{"alpha": 1.0, "momentum": 0}]), SLUG).severity is Severity.ERROR
    assert findings(_run("RMSprop", [{"alpha": 0.9, "eps": 1.0, "momentum": 0.9}]), SLUG) == []


def test_weight_decay_against_the_lr_applied():
    assert only(_run("SGD", [{"weight_decay": 10}], lrs=(0.1,)), SLUG).severity is Severity.ERROR
    f = only(_run("AdamW", [{"weight_decay": 2}], lrs=(0.1,)), SLUG)
    assert f.severity is Severity.WARNING and "20%" in f.message
    assert findings(_run("AdamW", [{"weight_decay": 1.0}], lrs=(3e-4,)), SLUG) == []
    assert findings(_run("SGD", [{"weight_decay": 5e-4}], lrs=(0.1,)), SLUG) == []
    # Adam's L2 term goes through its normalisation: not a shrink factor
    assert findings(_run("Adam", [{"weight_decay": 10}], lrs=(0.1,)), SLUG) == []


def test_an_unknown_optimizer_or_a_trace_without_settings_is_silent():
    assert findings(_run("Lion", [{"betas": [0.999, 0.9]}]), SLUG) == []
    assert findings(_run("Adam", [None]), SLUG) == []


def test_the_watcher_records_each_groups_settings():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
        torch.optim.Adam([{"params": a.parameters()},
                          {"params": b.parameters(), "betas": (0.5, 0.99)}], lr=1e-3)
        torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    hyper = [e["hyper"] for e in rec.trace.of_kind("optimizer_init")]
    assert hyper[0][0]["betas"] == [0.9, 0.999] and hyper[1][0]["betas"] == [0.5, 0.99]
    assert hyper[2][0]["momentum"] == 0.9 and hyper[2][0]["dampening"] == 0


def test_a_group_added_later_is_judged_with_its_own_lr():
    t = TraceBuilder()
    t._params([0, 1])
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=[0], lrs=[0.1], hyper=[{"weight_decay": 1.0}]), 3)
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=[1], lrs=[1e-3], hyper=[{"weight_decay": 1.0}]), 4)
    for _ in range(2):
        t.backward(fresh=[0, 1], line=8)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[0.1, 1e-3]), 9)
        t.step(line=9)
    f = only(t, SLUG)  # the first group (lr 0.1 x 1.0), not the added one (1e-3 x 1.0)
    assert "at lr 0.1" in f.message and len(f.evidence["settings"]) == 1


def test_a_weight_decay_in_sgds_dampening_is_a_warning():
    for hyper in ({"momentum": 0.9, "dampening": 1e-4, "weight_decay": 0},
                  {"momentum": 0, "dampening": 5e-4, "weight_decay": 0}):
        f = only(_run("SGD", [hyper]), SLUG)
        assert f.severity is Severity.WARNING and f.evidence["settings"] == ["dampening"]
        assert "weight_decay=" in f.fix and "by keyword" in f.fix


def test_dampenings_that_are_meant_are_silent():
    for hyper in ({"momentum": 0.9, "dampening": 0, "weight_decay": 5e-4},
                  {"momentum": 0.9, "dampening": 0.9, "weight_decay": 0},
                  {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0},
                  {"momentum": 0.5, "dampening": 0.005, "weight_decay": 1e-4}):
        assert findings(_run("SGD", [hyper]), SLUG) == []
    # another optimizer's small setting of that name is not SGD's dampening
    assert findings(_run("RMSprop", [{"momentum": 0.9, "dampening": 1e-4, "alpha": 0.99}]), SLUG) == []
