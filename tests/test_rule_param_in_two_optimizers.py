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


def _bilevel(turns=3, arch_lines=(20,), weight_line=30, arch_first=True):
    """A DARTS-like loop: optimizer 1 owns the architecture parameter 4 and steps on the
    backward of ``arch_lines``; optimizer 0 owns every parameter (4 too) and steps on the
    backward of ``weight_line``."""
    t = TraceBuilder()
    t.param(4, "alpha")
    t.optimizer(0, [0, 1, 4], line=3)
    t.optimizer(1, [4], line=4, cls="Adam")
    for i in range(turns):
        arch = arch_lines[i % len(arch_lines)]

        def arch_step():
            t.clear([4], opt=1, line=arch - 1)
            t.backward(fresh=[0, 1, 4], line=arch)
            t.step(1, line=arch + 1)

        def weight_step():
            t.clear([0, 1, 4], opt=0, line=weight_line - 1)
            t.backward(fresh=[0, 1, 4], line=weight_line)
            t.step(0, line=weight_line + 1)

        (arch_step if arch_first else weight_step)()
        (weight_step if arch_first else arch_step)()
    return t


def test_a_smaller_optimizer_on_its_own_loss_inside_a_larger_one_is_a_warning_at_the_larger():
    f = only(_bilevel(), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 3
    assert "alpha is stepped by Adam on the gradient of the backward at line 20" in f.message
    assert "also by SGD" in f.message and "line 30" in f.message
    assert "leave out alpha" in f.fix
    assert [r.location.line for r in f.related] == [4, 31]
    f = only(_bilevel(arch_first=False), SLUG)
    assert f.location.line == 3


def test_turns_taken_once_a_warm_up_are_silent():
    t = TraceBuilder()
    t.param(4, "head.weight")
    t.optimizer(0, [0, 1, 4], line=3)
    t.optimizer(1, [4], line=4, cls="Adam")
    for _ in range(3):
        t.clear([4], opt=1, line=9)
        t.backward(fresh=[0, 1, 4], line=10)
        t.step(1, line=11)
    for _ in range(3):
        t.clear([0, 1, 4], opt=0, line=19)
        t.backward(fresh=[0, 1, 4], line=20)
        t.step(0, line=21)
    assert findings(t, SLUG) == []


def test_turns_on_one_loss_or_without_a_gradient_for_the_shared_parameters_are_silent():
    assert findings(_bilevel(weight_line=20), SLUG) == []
    t = TraceBuilder()
    t.param(4, "alpha")
    t.optimizer(0, [0, 1, 4], line=3)
    t.optimizer(1, [4], line=4, cls="Adam")
    for _ in range(3):
        t.clear([4], opt=1, line=19)
        t.backward(fresh=[4], line=20)
        t.step(1, line=21)
        t.clear([0, 1, 4], opt=0, line=29)
        t.backward(fresh=[0, 1], line=30)
        t.step(0, line=31, without_grad=[4])
    assert findings(t, SLUG) == []


def test_two_optimizers_that_each_own_parameters_of_their_own_are_silent():
    t = TraceBuilder()
    t.param(4, "trunk.weight")
    t.optimizer(0, [0, 4], line=3)
    t.optimizer(1, [1, 4], line=4)
    for _ in range(3):
        t.backward(fresh=[0, 1, 4], line=20)
        t.step(0, line=21)
        t.clear([0, 1, 4], opt=0, line=22)
        t.backward(fresh=[0, 1, 4], line=30)
        t.step(1, line=31)
        t.clear([0, 1, 4], opt=1, line=32)
    assert findings(t, SLUG) == []
