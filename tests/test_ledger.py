"""The gradient ledger and the zero_grad-family rules on hand-written traces (no torch)."""

from __future__ import annotations

from graddoctor.trace import Trace, TraceBuilder
from rule_traces import basic, lbfgs_loop, slugs


def test_clean_loop_is_silent():
    assert slugs(basic(TraceBuilder(), with_clear=True)) == []


def test_set_to_none_conditional_branch_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for i in range(4):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1] if i % 2 == 0 else [0], line=6)
        t.step(0, line=7)
    assert slugs(t.trace) == []


def test_accumulation_with_clear_at_boundary_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for i in range(8):
        t.backward(fresh=[0] if i % 4 == 0 else [], accumulated=[] if i % 4 == 0 else [0], line=6)
        if (i + 1) % 4 == 0:
            t.step(0, line=8)
            t.clear([0], line=9)
    assert slugs(t.trace) == []


def test_fgsm_input_gradient_backward_is_not_misplaced():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for _ in range(2):
        t.backward(fresh=[0], extra_leaves=1, line=6)  # loss.backward() for x.grad
        t.clear([0], opt=None, line=7)  # model.zero_grad()
        t.backward(fresh=[0], line=9)
        t.step(0, line=10)
    assert slugs(t.trace) == []


def test_lbfgs_closure_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3, cls="LBFGS")
    for _ in range(3):
        t.event("step_begin", line=9, opt=0, closure=True)
        for _ in range(3):  # the closure is evaluated several times inside one step
            t.clear([0], line=6)
            t.backward(fresh=[0], in_step=0, line=7)
        t.step(0, line=9, closure=True)
    assert slugs(t.trace) == []


def test_gan_generator_backward_into_discriminator_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)  # D
    t.optimizer(1, [1], line=4)  # G
    for _ in range(3):
        t.clear([0], opt=0, line=6)
        t.backward(fresh=[0, 1], line=7)  # D loss on non-detached fake: G gets grads too
        t.step(0, line=8)
        t.clear([1], opt=1, line=9)  # discards G's unused grads: a new phase starts after it
        t.backward(fresh=[0, 1], line=10)  # G loss flows through D
        t.step(1, line=11)
    assert slugs(t.trace) == []


def test_param_not_in_optimizer_and_without_grad():
    t = TraceBuilder()
    t.optimizer(0, [0, 2], line=3)
    for _ in range(3):
        t.clear([0, 2], line=5)
        t.backward(fresh=[0, 1], line=6)
        t.event("step", line=7, opt=0, closure=False, skipped=False, without_grad=[2])
    assert slugs(t.trace) == [("param-not-in-optimizer", 3), ("param-without-grad", 3)]


def test_frozen_params_left_out_are_silent():
    t = TraceBuilder()
    t.param(2, requires_grad=False)
    t.optimizer(0, [0], line=3)
    for _ in range(3):
        t.clear([0], line=5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    assert slugs(t.trace) == []


def test_trace_round_trips_through_json_lines():
    trace = basic(TraceBuilder(), with_clear=False)
    again = Trace.loads(trace.dumps())
    assert [e.to_json() for e in again] == [e.to_json() for e in trace]
    assert slugs(again) == slugs(trace)


def test_a_closure_that_clears_is_silent_and_one_evaluation_is_not_a_phase_of_its_own():
    assert slugs(lbfgs_loop(TraceBuilder(), clear_inside=True)) == []
    assert slugs(lbfgs_loop(TraceBuilder(), clear_inside=False, evaluations=1)) == []


