"""clip-shrinks-every-update (GD135) on hand-written traces: clip events with the total norm
each returned, and the optimizer stepped after them."""

from __future__ import annotations

import math

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from rule_traces import P, fold_hard

SLUG = "clip-shrinks-every-update"


def _run(norms, limit=1e-4, cls="SGD", optimizer=True, via="clip_grad_norm_"):
    t = TraceBuilder()
    t._params(P)
    if optimizer:
        t.put(ev.optimizer_init(opt=0, cls=cls, params=list(P), lrs=[0.1]), 2)
    for total in norms:
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.clip(via=via, params=list(P), with_grad=list(P), untracked=0, limit=limit,
                      norm_type=2.0, norm_only=limit == math.inf, total_norm=total, edited=[]), 12)
        if optimizer:
            t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[0.1]), 13)
            t.step(0, line=13)
    return t.trace


def _found(trace):
    return list(find_rule(SLUG)().check(Analysis(trace)))


def test_a_tiny_limit_under_sgd_is_a_warning():
    found = _found(_run([1.2, 0.9, 1.1, 1.0]))
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    f = found[0]
    assert f.location.line == 12 and "every one of the 4 updates" in f.message
    assert "divided by 1.2e+04" in f.message and "raise max_norm" in f.fix
    assert f.evidence["optimizer"] == "SGD" and f.evidence["first_total_norm"] == 1.2


def test_a_tiny_limit_shrinking_every_update_20x_is_a_warning():
    # max_norm=5e-3 (a typo for 5.0) under norms of 0.15-0.4: 30x-80x, below the 100x that a
    # usual limit needs, but a limit that small is itself the cause
    f = _found(_run([0.16, 0.38, 0.15, 0.4], limit=5e-3))[0]
    assert f.severity is Severity.WARNING and "by 30× or more" in f.message
    assert _found(_run([0.09, 0.12, 0.1], limit=5e-3)) == []  # 18x at one update: not every one
    assert _found(_run([0.16, 0.38, 0.15], limit=5e-3, cls="Adam")) == []
    assert _found(_run([5.0, 6.0, 7.0], limit=0.1)) == []  # 50x of a usual limit: not judged


def test_a_usual_limit_under_huge_gradients_is_info():
    f = _found(_run([5000.0, 4000.0, 3000.0], limit=1.0))[0]
    assert f.severity is Severity.INFO and "reduction='mean'" in f.fix


def test_a_hand_written_update():
    f = _found(_run([1.0, 1.0, 1.0], limit=1e-3, optimizer=False))[0]
    assert "the hand-written update" in f.message


@pytest.mark.parametrize("case", [
    dict(norms=[1.0, 1.0, 1.0], limit=1.0),  # clips now and then, at most
    dict(norms=[0.6, 0.4, 0.7], limit=0.5),  # RL's 0.5 near the norms
    dict(norms=[1.0, 1.0, 1.0, 1.0], cls="Adam"),  # Adam divides the scale out
    dict(norms=[1.0, 1.0, 1.0, 1.0], cls="MyOptimizer"),  # unknown: silent
    dict(norms=[1.0, 1.0]),  # too few clips
    dict(norms=[1.0, 1e-3, 1.0, 1.0]),  # one update left nearly whole: not every update
    dict(norms=[1.0, None, 1.0, 1.0]),  # a norm not read (on a GPU)
    dict(norms=[1.0, 1.0, 1.0], limit=math.inf),  # only measures
    dict(norms=[1.0, 1.0, 1.0], via="clip_grad_value_"),
])
def test_silent(case):
    assert _found(_run(**case)) == []


def test_folding_keeps_the_finding():
    trace = _run([1.0] * 12)
    assert [f.message for f in _found(fold_hard(trace))] == [f.message for f in _found(trace)]


def _value_run(shares, limit=1e-3, cls="SGD", kept=0.01, optimizer=True):
    t = TraceBuilder()
    t._params(P)
    if optimizer:
        t.put(ev.optimizer_init(opt=0, cls=cls, params=list(P), lrs=[0.1]), 2)
    for share in shares:
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.clip(via="clip_grad_value_", params=list(P), with_grad=list(P), untracked=0,
                      limit=limit, norm_type=None, norm_only=False, total_norm=None, edited=[],
                      clipped=share, kept=None if share is None else kept), 12)
        if optimizer:
            t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[0.1]), 13)
            t.step(0, line=13)
    return t.trace


def test_a_value_clip_of_nearly_every_element_under_sgd_is_a_warning():
    found = _found(_value_run([0.99, 0.98, 1.0, None, None]))
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "±0.001" in f.message and "3 calls measured 98% or more" in f.message
    assert "sign(g) × 0.001" in f.message and "clip_value=0.001" in f.fix
    assert f.evidence["optimizer"] == "SGD" and f.evidence["clipped"] == [0.99, 0.98, 1.0]


def test_a_value_clip_under_adam_is_info():
    f = _found(_value_run([1.0, 1.0, 1.0], cls="Adam"))[0]
    assert f.severity is Severity.INFO and "Adam then normalises" in f.message


def test_a_usual_clip_value_under_huge_gradients_is_info():
    f = _found(_value_run([0.95, 0.97, 0.96], limit=1.0))[0]
    assert f.severity is Severity.INFO and "reduction='mean'" in f.fix


def test_a_value_clip_before_a_hand_written_update():
    f = _found(_value_run([1.0, 1.0, 1.0], optimizer=False))[0]
    assert "the hand-written update" in f.message and f.severity is Severity.WARNING


@pytest.mark.parametrize("case", [
    dict(shares=[0.99, 0.3, 0.99]),  # one call clipped few elements: not every update
    dict(shares=[0.02, 0.0, 0.05], limit=1.0),  # an occasional clip
    dict(shares=[1.0, 1.0, 1.0], kept=0.8),  # gradients just above the limit: little changes
    dict(shares=[1.0, 1.0]),  # too few measured
    dict(shares=[None, None, None, None]),  # not measured (GPU gradients)
    dict(shares=[1.0, 1.0, 1.0], cls="MyOptimizer"),  # unknown update rule
])
def test_value_clip_silent(case):
    assert _found(_value_run(**case)) == []


def test_value_share_reads_what_the_clip_will_do():
    import torch

    from graddoctor.instrument.clip import value_share

    a = torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.tensor([3.0, -4.0, 0.5, 0.0])
    b = torch.nn.Parameter(torch.zeros(2))  # no gradient: left out
    share, kept = value_share([a, b], 1.0)
    assert share == 0.5
    assert kept == pytest.approx(math.sqrt(1 + 1 + 0.25) / math.sqrt(9 + 16 + 0.25), abs=1e-6)
    assert value_share([a], torch.tensor(1.0)) is None  # a tensor limit is not read
    assert value_share([b], 1.0) is None
