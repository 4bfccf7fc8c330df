"""frozen-param-updated (GD109): the rule on hand-written traces, and the instrumentation's
``step_begin.frozen`` signal on real optimizers."""

from __future__ import annotations

import linecache

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.optim import zero_grad_mover
from graddoctor.rules.frozen_param_updated import FrozenParamUpdated
from graddoctor.trace import TraceBuilder


def findings(t: TraceBuilder):
    return list(FrozenParamUpdated().check(Analysis(t.trace)))


def begin(t, frozen, opt=0, line=None):
    return t.put(ev.step_begin(opt=opt, norm_pids=[], norms=[], frozen=frozen), line)


def update(t, params, frozen=(), set_to_none=False, fresh=None, opt=0):
    """One update: zero_grad (line 20), backward (21), step_begin + step (22)."""
    t.clear(params, opt=opt, line=20, set_to_none=set_to_none)
    t.backward(fresh=list(params if fresh is None else fresh), line=21)
    begin(t, [list(f) for f in frozen], opt=opt, line=22)
    return t.step(opt, line=22)


def trained(cls="SGD", params=(0, 1, 2)):
    """An optimizer over ``params`` and one normal update: every param has had a gradient."""
    t = TraceBuilder()
    t.optimizer(0, list(params), line=5, cls=cls)
    update(t, params)
    return t


# -- the signal ---------------------------------------------------------------------------
@pytest.mark.parametrize("mover, severity", [("momentum", Severity.WARNING),
                                             ("moments", Severity.WARNING),
                                             ("weight_decay", Severity.ERROR),
                                             ("unknown", Severity.INFO)])
def test_a_frozen_param_the_optimizer_moves_is_reported_at_its_freeze(mover, severity):
    t = trained()
    freeze = t.put(ev.freeze(calls=2), line=12)
    update(t, [0, 1, 2], fresh=[2], frozen=[(0, mover, freeze.seq), (1, mover, freeze.seq)])
    update(t, [0, 1, 2], fresh=[2], frozen=[(0, mover, freeze.seq), (1, mover, freeze.seq)])
    (f,) = findings(t)
    assert (f.location.line, f.severity, f.step) == (12, severity, 2)
    assert [r.location.line for r in f.related] == [20, 22]  # the zero_grad, the first step
    assert "p0, p1 are frozen here" in f.message and "zero_grad(set_to_none=False)" in f.message
    assert f.evidence["moved_by"] == [mover] and f.evidence["zero_grad_set_to_none_false"]


def test_plain_sgd_leaves_a_zero_gradient_param_in_place():
    t = trained()
    freeze = t.put(ev.freeze(), line=12)
    for _ in range(3):
        update(t, [0, 1, 2], fresh=[2], frozen=[(0, None, freeze.seq)])
    assert findings(t) == []


def test_frozen_after_the_backward_the_step_applies_its_last_real_gradient():
    # backward, requires_grad_(False), step: that step is meant; set_to_none=True then drops it
    t = trained(cls="AdamW")
    t.backward(fresh=[0, 1, 2], line=21)
    freeze = t.put(ev.freeze(), line=12)
    begin(t, [[0, "weight_decay", freeze.seq]], line=22)
    t.step(0, line=22)
    update(t, [0, 1, 2], fresh=[1, 2], set_to_none=True)  # grad None: nothing frozen recorded
    assert findings(t) == []


def test_frozen_after_the_backward_with_zero_filled_grads_is_reported_from_the_next_step():
    t = trained(cls="AdamW")
    t.clear([0, 1, 2], line=20, set_to_none=False)
    t.backward(fresh=[0, 1, 2], line=21)
    freeze = t.put(ev.freeze(), line=12)
    begin(t, [[0, "weight_decay", freeze.seq]], line=22)
    t.step(0, line=22)  # step 2: the real gradient
    update(t, [0, 1, 2], fresh=[1, 2], frozen=[(0, "weight_decay", freeze.seq)])  # step 3
    (f,) = findings(t)
    assert (f.location.line, f.step, f.severity) == (12, 3, Severity.ERROR)


def test_a_stale_gradient_never_cleared_is_left_to_stale_grad():
    t = trained()
    freeze = t.put(ev.freeze(), line=12)
    for _ in range(2):  # the frozen param is never cleared: its old gradient is applied again
        t.clear([1, 2], line=20, set_to_none=False)
        t.backward(fresh=[1, 2], line=21)
        begin(t, [[0, "momentum", freeze.seq]], line=22)
        t.step(0, line=22)
    assert findings(t) == []


@pytest.mark.parametrize("mover, reported", [("momentum", False), ("moments", False),
                                             ("unknown", False), ("weight_decay", True)])
def test_a_param_that_never_had_a_gradient_moves_only_by_weight_decay(mover, reported):
    # its .grad was put there by hand (zeros): the optimizer's buffers hold zeros
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=5, cls="AdamW")
    for _ in range(2):
        update(t, [0, 1], fresh=[1], frozen=[(0, mover, None)])
    assert len(findings(t)) == int(reported)


def test_without_a_seen_freeze_it_points_at_the_zero_grad():
    # p.requires_grad = False is an attribute write graddoctor does not see
    t = trained(cls="Adam")
    update(t, [0, 1, 2], fresh=[2], frozen=[(0, "moments", None), (1, "moments", None)])
    (f,) = findings(t)
    assert f.location.line == 20
    assert [r.location.line for r in f.related] == [22]
    assert "frozen (requires_grad is False)" in f.message


def test_without_a_freeze_or_a_zero_filling_clear_it_points_at_the_step():
    t = trained()
    t.clear([0, 1, 2], line=20, set_to_none=True)
    t.backward(fresh=[1, 2], line=21)
    begin(t, [[0, "momentum", None]], line=22)  # p0.grad set back to zeros by hand
    t.step(0, line=22)
    (f,) = findings(t)
    assert f.location.line == 22 and f.related == ()
    assert ".grad is a tensor, not None" in f.message and not f.evidence["zero_grad_set_to_none_false"]


def test_one_finding_per_freeze_with_the_worst_mover():
    t = trained(params=(0, 1, 2, 3))
    first = t.put(ev.freeze(), line=12)
    second = t.put(ev.freeze(), line=13)
    frozen = [(0, "momentum", first.seq), (1, "weight_decay", first.seq), (2, "momentum", second.seq)]
    for _ in range(3):
        update(t, [0, 1, 2, 3], fresh=[3], frozen=frozen)
    got = {f.location.line: f for f in findings(t)}
    assert set(got) == {12, 13}
    assert got[12].severity == Severity.ERROR and got[12].evidence["moved_by"] == ["momentum", "weight_decay"]
    assert got[13].severity == Severity.WARNING and got[13].step == 2


def test_two_optimizers_sharing_a_freeze_get_a_finding_each():
    t = TraceBuilder()
    t.optimizer(0, [0], line=5)
    t.optimizer(1, [1], line=6)
    update(t, [0], opt=0)
    update(t, [1], opt=1)
    freeze = t.put(ev.freeze(calls=2), line=12)
    update(t, [0], fresh=[], frozen=[(0, "momentum", freeze.seq)], opt=0)
    update(t, [1], fresh=[], frozen=[(1, "momentum", freeze.seq)], opt=1)
    assert sorted(f.evidence["optimizer"] for f in findings(t)) == [0, 1]


def test_step_begins_without_the_field_are_silent():
    t = trained()
    t.event("step_begin", line=22, opt=0, closure=False, norm_pids=[], norms=[], nonfinite=[])
    t.step(0, line=22)
    assert findings(t) == []


# -- the instrumentation ---------------------------------------------------------------------
def _mover(optimizer_cls, steps=1, **hyper):
    p = nn.Parameter(torch.ones(3))
    opt = optimizer_cls([p], **hyper)
    for _ in range(steps):
        p.grad = torch.ones(3)
        opt.step()
    return zero_grad_mover(opt, opt.param_groups[0], opt.state.get(p))


@pytest.mark.parametrize("cls, hyper, steps, expected", [
    (torch.optim.SGD, dict(lr=0.1), 1, None),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9), 0, None),  # no buffer yet
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9), 1, "momentum"),
    (torch.optim.SGD, dict(lr=0.1, weight_decay=1e-4), 0, "weight_decay"),
    (torch.optim.SGD, dict(lr=0.0, momentum=0.9, weight_decay=1e-4), 1, None),
    (torch.optim.Adam, dict(lr=1e-3), 0, None),
    (torch.optim.Adam, dict(lr=1e-3), 1, "moments"),
    (torch.optim.AdamW, dict(lr=1e-3), 0, "weight_decay"),  # default weight_decay=0.01
    (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.0), 1, "moments"),
    (torch.optim.RMSprop, dict(lr=1e-3), 1, None),
    (torch.optim.RMSprop, dict(lr=1e-3, momentum=0.9), 1, "momentum"),
    (torch.optim.Adagrad, dict(lr=1e-2), 1, None),
    (torch.optim.Adadelta, dict(), 1, None),
    (torch.optim.ASGD, dict(lr=1e-2), 1, "weight_decay"),  # lambd=1e-4 decays every param
])
def test_zero_grad_mover(cls, hyper, steps, expected):
    assert _mover(cls, steps, **hyper) == expected


def test_zero_grad_mover_of_an_unknown_optimizer():
    class Custom(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=0.1))

        def step(self, closure=None):
            pass

    assert _mover(Custom) == "unknown"


def _frozen_entries(rec):
    return [e["frozen"] for e in rec.trace.events if e.kind == "step_begin"]


def test_instrumentation_records_frozen_params_with_a_grad_and_their_freeze():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(5, 3)
        for i in range(4):
            if i == 1:
                model[0].requires_grad_(False)
            if i == 3:
                model[0].requires_grad_(True)  # unfrozen: nothing frozen at its step
            opt.zero_grad(set_to_none=False)
            model(x).sum().backward()
            opt.step()
    freezes = [e for e in rec.trace.events if e.kind == "freeze"]
    assert len(freezes) == 1
    seq = freezes[0].seq
    entries = _frozen_entries(rec)
    assert entries[0] == [] and entries[3] == []
    assert entries[1] == entries[2] == [[0, "momentum", seq], [1, "momentum", seq]]


def test_instrumentation_skips_params_removed_from_the_optimizer_and_grads_set_to_none():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        a, b, c = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)
        opt = torch.optim.AdamW([{"params": a.parameters()}, {"params": [*b.parameters(), *c.parameters()]}])
        x = torch.randn(5, 3)
        for i in range(3):
            if i == 1:
                a.requires_grad_(False)
                opt.param_groups.pop(0)
                for p in b.parameters():
                    p.requires_grad = False
                    p.grad = None
            for m in (a, b, c):
                m.zero_grad(set_to_none=False)
            c(b(a(x))).sum().backward()
            opt.step()
    assert _frozen_entries(rec) == [[], [], []]


def test_instrumentation_reads_the_hyper_parameters_before_the_update():
    # the first step with a zero grad creates Adam's state; judged before it, nothing moves
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        p = nn.Parameter(torch.ones(2))
        q = nn.Parameter(torch.ones(2))
        opt = torch.optim.Adam([p, q], lr=0.1)
        p.requires_grad = False
        p.grad = torch.zeros(2)
        for _ in range(2):
            q.grad = torch.ones(2)
            opt.step()
    assert _frozen_entries(rec) == [[[0, None, None]], [[0, "moments", None]]]


def test_a_failure_reading_the_optimizer_loses_only_the_frozen_entries(monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr("graddoctor.instrument.optim.zero_grad_mover", broken)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p, q], lr=0.1, momentum=0.9)
        p.requires_grad_(False)
        p.grad, q.grad = torch.zeros(2), torch.ones(2)
        opt.step()
    (begin,) = [e for e in rec.trace.events if e.kind == "step_begin"]
    assert begin["frozen"] == [] and begin["norm_pids"] == [0, 1]
    assert [e["where"] for e in rec.trace.events if e.kind == "internal_error"] == \
        ["optimizer step (frozen parameters)"]
    assert torch.equal(q.data, torch.full((2,), 0.9))  # the user's step ran as usual


# -- gradients zeroed by hand in a group with weight decay ---------------------------------------
def _zeroing_run(decay, zero, steps=4):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=decay)
        x = torch.randn(5, 3)
        for i in range(steps):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            zero(model, i)
            opt.step()
    return list(FrozenParamUpdated().check(Analysis(rec.trace)))


def _first_layer(model, i):
    for p in model[0].parameters():
        p.grad.zero_()


def test_gradients_zeroed_by_hand_under_weight_decay_are_reported_at_the_zeroing():
    (f,) = _zeroing_run(0.01, _first_layer)
    assert f.severity is Severity.WARNING and f.evidence["zeroed_by_hand"]
    assert len(f.evidence["params"]) == 2 and f.evidence["params"][0].endswith("0.weight")
    # the zeroing is in another function: the source between backward and step shows no write
    # of a .grad, so the finding is at the step (the fixtures hold the zeroing line itself)
    assert linecache.getline(__file__, f.location.line).strip() == "opt.step()"
    assert "weight_decay=0.01" in f.message and "requires_grad_(False)" in f.fix


def test_gradients_zeroed_without_decay_for_part_or_at_some_steps_are_silent():
    def row(model, i):
        model[0].weight.grad[0].zero_()

    def warm_up(model, i):
        if i < 2:
            _first_layer(model, i)

    def everything(model, i):
        for p in model.parameters():
            p.grad.zero_()

    assert _zeroing_run(0.0, _first_layer) == []
    assert _zeroing_run(0.01, row) == []
    assert _zeroing_run(0.01, warm_up) == []
    assert _zeroing_run(0.01, everything) == []  # nothing trains: grads-cleared-before-step's
