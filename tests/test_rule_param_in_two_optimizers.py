"""param-in-two-optimizers (GD115) on hand-written traces: two optimizers stepping one gradient
of the same parameters, and the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, fold_hard, only

SLUG = "param-in-two-optimizers"


def two(head_params=(2, 3)):
    t = TraceBuilder()
    t.param(2, "head.weight")
    t.param(3, "head.bias")
    t.optimizer(0, [0, 1, 2, 3], line=3)
    t.optimizer(1, list(head_params), line=4, cls="Adam")
    return t


def test_both_stepping_one_gradient_is_a_warning_at_the_later_optimizer():
    t = two()
    for _ in range(3):
        t.clear([0, 1, 2, 3], opt=0, line=6)
        t.clear([2, 3], opt=1, line=7)
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(0, line=9)
        t.step(1, line=10)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert "head.weight, head.bias are owned by both SGD and Adam" in f.message
    assert "seen 3 times" in f.message
    assert [r.location.line for r in f.related] == [3, 10]


def test_disjoint_optimizers_are_silent():
    t = two()
    t.optimizer(2, [], line=5)
    for _ in range(3):
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(1, line=10)
    t2 = TraceBuilder()
    t2.optimizer(0, [0, 1], line=3)
    t2.optimizer(1, [2, 3], line=4)
    for _ in range(3):
        t2.backward(fresh=[0, 1, 2, 3], line=8)
        t2.step(0, line=9)
        t2.step(1, line=10)
    assert findings(t, SLUG) == [] and findings(t2, SLUG) == []


def test_alternating_optimizers_each_on_its_own_gradient_are_silent():
    t = two()
    for i in range(4):
        t.clear([0, 1, 2, 3], opt=0, line=6)
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(i % 2, line=9)
    assert findings(t, SLUG) == []


def test_a_cleared_gradient_between_the_steps_is_silent():
    t = two()
    for _ in range(3):
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(0, line=9)
        t.clear([0, 1, 2, 3], opt=0, line=6, set_to_none=False)
        t.step(1, line=10, without_grad=[])
    assert findings(t, SLUG) == []


def test_a_second_step_on_parameters_without_gradient_is_silent():
    t = two()
    for _ in range(3):
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(0, line=9)
        t.step(1, line=10, without_grad=[2, 3])
    assert findings(t, SLUG) == []


def test_an_optimizer_rebuilt_over_the_same_parameters_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for _ in range(2):
        t.backward(fresh=[0, 1], line=8)
        t.step(0, line=9)
    t.optimizer(1, [0, 1], line=11)
    for _ in range(2):
        t.backward(fresh=[0, 1], line=8)
        t.step(1, line=9)
    assert findings(t, SLUG) == []


def test_the_finding_survives_folding():
    t = two()
    for _ in range(12):
        t.clear([0, 1, 2, 3], opt=0, line=6)
        t.backward(fresh=[0, 1, 2, 3], line=8)
        t.step(0, line=9)
        t.step(1, line=10)
    f = only(fold_hard(t.trace), SLUG)
    assert f.location.line == 4 and f.evidence["occurrences"] == 12
