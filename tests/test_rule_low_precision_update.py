"""low-precision-update (GD236): hand-written traces, and the optimizer step hooks in-process
over float16 / bfloat16 parameters; nonfinite-grad naming such an eps as the cause."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, nan_step, only

SLUG = "low-precision-update"


def low(t, what, unchanged=None, eps=None):
    t.put(ev.low_precision(opt=0, cls="Adam", dtype="float16", what=what, eps=eps, lr=1e-3,
                           unchanged=unchanged, params=2), 9)


def test_an_eps_that_rounds_to_zero_is_a_warning_at_the_optimizer():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=4, cls="Adam")
    low(t, "eps", eps=1e-8)
    f = only(t, SLUG)
    assert f.location.line == 4 and "eps=1e-08" in f.message and "rounds to 0" in f.message


def test_weights_that_do_not_move_are_a_warning_only_above_the_share():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=4)
    low(t, "frozen", unchanged=0.99)
    assert "99%" in only(t, SLUG).message
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=4)
    low(t, "frozen", unchanged=0.2)
    assert findings(t, SLUG) == []


def test_nonfinite_grad_names_the_eps_as_the_cause():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1, cls="Adam")
    low(t, "eps", eps=1e-8)
    nan_step(t)
    (f,) = findings(t, "nonfinite-grad")
    assert "eps=1e-08 rounds to 0 in float16" in f.message and "eps=1e-4" in f.fix


def steps(dtype, lr, cls=torch.optim.SGD, schedule=None, scale=1.0, **kw):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(dtype)
    x = torch.randn(16, 8, dtype=dtype)
    with Instrumentation(rec):
        opt = cls(model.parameters(), lr=lr, **kw)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule else None
        for _ in range(5):
            opt.zero_grad()
            (model(x).float().pow(2).mean() * scale).backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()
    return [(e.get("what"), e.get("unchanged")) for e in rec.trace if e.kind == "low_precision"]


def test_the_hooks_measure_bfloat16_updates():
    ((what, share),) = steps(torch.bfloat16, 1e-6)
    assert what == "frozen" and share > 0.9
    ((what, share),) = steps(torch.bfloat16, 0.1)
    assert share < 0.5


def test_the_hooks_see_adam_eps_in_float16_and_nothing_in_float32():
    assert ("eps", None) in steps(torch.float16, 1e-3, torch.optim.Adam)
    assert steps(torch.float32, 1e-3, torch.optim.Adam) == []  # an lr that is not the cause


def test_float32_updates_below_the_resolution_are_measured_only_under_a_steady_lr():
    ((what, share),) = steps(torch.float32, 1e-10)
    assert what == "frozen" and share > 0.9
    ((what, share),) = steps(torch.float32, 1e-7, torch.optim.Adam)
    assert share < 0.5  # Adam's update is about lr, whatever the gradient's size
    # an lr of 1e-6 or more is not judged, even where the weights keep their values (vanishing
    # gradients: a gradient scaled down to nothing)
    assert steps(torch.float32, 1e-3, scale=1e-12) == []
    # a warm-up ramping from a tiny lr: its first updates are tiny on purpose
    assert steps(torch.float32, 1e-10, schedule=lambda s: s + 1.0) == []


def test_a_float32_finding_speaks_of_the_learning_rate_not_of_half_precision():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=4)
    t.put(ev.low_precision(opt=0, cls="SGD", dtype="float32", what="frozen", eps=None, lr=1e-10,
                           unchanged=1.0, params=2), 9)
    f = only(t, SLUG)
    assert "learning rate is orders of magnitude too small" in f.message and "lr=1e-10 looks like a typo" in f.fix
    assert "autocast" not in f.fix
