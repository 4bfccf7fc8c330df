"""eps-dominates-update (GD176): hand-written traces of eps_share events, and the watcher that
reads them from real optimizers' state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.epsshare import DOMINATES, _estimate
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, fold_hard

SLUG = "eps-dominates-update"


def _trace(shares=(0.9, 0.95, 1.0), cls="Adam", eps=1.0, group=0, more=()):
    t = TraceBuilder()
    t.optimizer(0, P, line=3, cls=cls)
    for i in range(4):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.step(0, line=12)
        if i == 2:
            t.put(ev.eps_share(opt=0, cls=cls, group=group, eps=eps, steps=[1, 2, 3][:len(shares)],
                               shares=list(shares), ratios=[80.0, 60.0, 50.0][:len(shares)]))
            for made in more:
                t.put(made)
    return t.trace


def test_adam_is_a_warning_at_the_construction():
    f = findings(_trace(), SLUG)
    assert len(f) == 1
    f = f[0]
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "Adam's eps=1 outweighs" in f.message and "50× to 80×" in f.message
    assert "lr × m / eps" in f.message and "momentum SGD" in f.message and "1e-8" in f.fix
    assert f.evidence["shares"] == [0.9, 0.95, 1.0]


def test_adagrad_is_plain_sgd():
    f = findings(_trace(cls="Adagrad"), SLUG)[0]
    assert "lr × g / eps" in f.message and "plain SGD" in f.message


def test_a_second_group_is_named():
    other = ev.eps_share(opt=0, cls="Adam", group=1, eps=1.0, steps=[1, 2, 3],
                         shares=[0.1, 0.0, 0.0], ratios=[1.0, 1.0, 1.0])
    assert "in param group 0" in findings(_trace(more=[other]), SLUG)[0].message


@pytest.mark.parametrize("shares", [(0.9, 0.3, 0.9), (0.9,), (0.2, 0.2, 0.2)])
def test_silent(shares):
    assert findings(_trace(shares=shares), SLUG) == []


def test_folding_keeps_the_finding():
    trace = _trace()
    assert [f.message for f in findings(fold_hard(trace), SLUG)] == \
        [f.message for f in findings(trace, SLUG)]


def test_the_estimate_is_bias_corrected():
    p = nn.Parameter(torch.ones(4))
    opt = torch.optim.RMSprop([p], lr=0.1, alpha=0.99)
    p.grad = torch.full((4,), 0.5)
    opt.step()
    v = _estimate("RMSprop", opt.param_groups[0], opt.state[p])
    assert torch.allclose(v, torch.full((4,), 0.25))  # 0.01 * g² / (1 - 0.99)


def _run(make, scale, steps=3):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = make(model.parameters())
        x, y = torch.randn(64, 8), torch.randn(64, 1)
        for _ in range(steps):
            opt.zero_grad()
            (scale * nn.functional.mse_loss(model(x), y)).backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("eps_share")]


def test_the_watcher_reads_the_state_not_the_value():
    big = _run(lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1.0), 1e-2)
    assert len(big) == 1 and big[0]["steps"] == [1, 2, 3] and min(big[0]["shares"]) > 0.5
    assert min(big[0]["ratios"]) > DOMINATES
    # the same eps next to gradients a thousand times larger: measured, not dominated
    large = _run(lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1.0), 1e4)
    assert len(large) == 1 and max(large[0]["shares"]) < 0.5
    assert _run(lambda ps: torch.optim.Adam(ps, lr=1e-3), 1e-2) == []  # default eps: not read
    assert _run(lambda ps: torch.optim.SGD(ps, lr=1e-3), 1e-2) == []


def test_a_short_run_is_told_at_its_end():
    short = _run(lambda ps: torch.optim.RMSprop(ps, lr=1e-3, eps=1.0), 1e-2, steps=2)
    assert len(short) == 1 and short[0]["steps"] == [1, 2] and short[0]["cls"] == "RMSprop"


def _with_momentum(momentum):
    t = TraceBuilder()
    t.put(ev.optimizer_init(opt=0, cls="RMSprop", params=list(P),
                            hyper=[{"momentum": momentum, "eps": 1.0}]), 3)
    t.clear(P, line=10)
    t.backward(fresh=P, line=11)
    t.step(0, line=12)
    t.put(ev.eps_share(opt=0, cls="RMSprop", group=0, eps=1.0, steps=[1, 2, 3],
                       shares=[1.0, 1.0, 1.0], ratios=[50.0, 50.0, 50.0]))
    return t.trace


def test_tensorflows_inception_recipe_is_told_as_info():
    f = findings(_with_momentum(0.9), SLUG)[0]
    assert f.severity is Severity.INFO and "Inception recipe" in f.message
    f = findings(_with_momentum(0.0), SLUG)[0]
    assert f.severity is Severity.WARNING and "plain SGD" in f.message
