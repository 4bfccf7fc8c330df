"""The gradient ledger and the zero_grad-family rules on hand-written traces (no torch)."""

from __future__ import annotations

from graddoctor.rules.engine import analyze
from graddoctor.analysis import Analysis
from graddoctor.trace import Trace, TraceBuilder


def slugs(trace) -> list[tuple[str, int]]:
    findings, errors = analyze(trace)
    assert not errors
    return sorted((f.rule, f.location.line) for f in findings if f.severity.value != "info")


def basic(t: TraceBuilder, with_clear: bool):
    t.optimizer(0, [0, 1], line=3)
    for i in range(3):
        if with_clear:
            t.clear([0, 1], line=5)
        if i == 0 or with_clear:
            t.backward(fresh=[0, 1], line=6)
        else:
            t.backward(accumulated=[0, 1], line=6)
        t.step(0, line=7)
    return t.trace


def test_clean_loop_is_silent():
    assert slugs(basic(TraceBuilder(), with_clear=True)) == []


def test_missing_zero_grad_points_at_backward():
    trace = basic(TraceBuilder(), with_clear=False)
    assert slugs(trace) == [("missing-zero-grad", 6)]
    led = Analysis(trace).ledger
    assert {u.pid for u in led.old_uses} == {0, 1}
    assert led.old_uses[0].step_index == 2


def test_partial_zero_grad_points_at_the_clear():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    t.backward(fresh=[0, 1], line=6)
    t.step(0, line=7)
    for _ in range(2):
        t.clear([0], opt=None, line=5)  # model_a.zero_grad(): param 1 is skipped
        t.backward(fresh=[0], accumulated=[1], line=6)
        t.step(0, line=7)
    assert slugs(t.trace) == [("partial-zero-grad", 5)]


def test_stale_grad_points_at_the_step():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    t.backward(fresh=[0, 1], line=6)
    t.step(0, line=7)
    t.clear([0], opt=None, line=5)
    t.backward(fresh=[0], line=6)  # param 1 gets nothing new but keeps its old grad
    t.step(0, line=7)
    assert slugs(t.trace) == [("stale-grad", 7)]


def test_set_to_none_conditional_branch_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for i in range(4):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1] if i % 2 == 0 else [0], line=6)
        t.step(0, line=7)
    assert slugs(t.trace) == []


def test_misplaced_zero_grad_between_backward_and_step():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for _ in range(2):
        t.backward(fresh=[0], line=6)
        t.clear([0], line=7)
        t.step(0, line=8)
    assert slugs(t.trace) == [("misplaced-zero-grad", 7)]


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


def test_no_optimizer_gives_one_info():
    t = TraceBuilder()
    for _ in range(3):
        t.backward(fresh=[0], line=6)
    findings, _ = analyze(t.trace)
    assert [(f.rule, f.severity.value) for f in findings] == [("param-not-in-optimizer", "info")]


def test_trace_round_trips_through_json_lines():
    trace = basic(TraceBuilder(), with_clear=False)
    again = Trace.loads(trace.dumps())
    assert [e.to_json() for e in again] == [e.to_json() for e in trace]
    assert slugs(again) == slugs(trace)


def _lbfgs(t: TraceBuilder, clear_inside: bool, evaluations: int = 4):
    """One ``step(closure)`` of an L-BFGS-like optimizer evaluating its closure several times."""
    from graddoctor import events as ev

    t.optimizer(0, [0, 1], line=3, cls="LBFGS")
    t.clear([0, 1], line=20)
    t.put(ev.step_begin(opt=0, norm_pids=[], norms=[], closure=True), line=21)
    for i in range(evaluations):
        if clear_inside:
            t.clear([0, 1], line=14)
        if clear_inside or i == 0:
            t.backward(fresh=[0, 1], line=16, in_step=0)
        else:
            t.backward(accumulated=[0, 1], line=16, in_step=0)
    t.step(0, line=21, closure=True)
    return t.trace


def test_a_closure_that_never_clears_is_caught_on_a_single_step():
    trace = _lbfgs(TraceBuilder(), clear_inside=False)
    assert slugs(trace) == [("missing-zero-grad", 16)]
    (finding,) = [f for f in analyze(trace)[0] if f.rule == "missing-zero-grad"]
    assert "closure" in finding.message and "closure" in finding.fix
    assert [r.location.line for r in finding.related] == [21]  # not its own line again


def test_a_closure_that_clears_is_silent_and_one_evaluation_is_not_a_phase_of_its_own():
    assert slugs(_lbfgs(TraceBuilder(), clear_inside=True)) == []
    assert slugs(_lbfgs(TraceBuilder(), clear_inside=False, evaluations=1)) == []


def test_a_window_holds_only_gradients_applied_for_the_first_time():
    """Missing zero_grad in an accumulation loop: each step re-applies every earlier gradient,
    but its accumulation window is still the k backwards it applies for the first time (the
    re-application is missing-zero-grad's finding, not a window of growing k)."""
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for i in range(12):
        if i == 0:
            t.backward(fresh=[0, 1], line=14)
        else:
            t.backward(accumulated=[0, 1], line=14)
        if (i + 1) % 4 == 0:
            t.step(0, line=16)
    (windows,) = Analysis(t.trace).windows.values()
    assert [w.k for w in windows] == [4, 4, 4]
    assert slugs(t.trace) == [("missing-zero-grad", 14)]


def test_a_backward_that_leaks_into_cleared_grads_is_named_as_the_source():
    """D is cleared every iteration, but the generator's backward (through an undetached D)
    writes D's grads after that clear: the finding names that backward, not 'never cleared'."""
    t = TraceBuilder()
    t.optimizer(0, [0], line=8)  # G
    t.optimizer(1, [1], line=9)  # D
    for i in range(3):
        t.clear([1], opt=1, line=12)
        t.clear([0], opt=0, line=13)
        t.backward(fresh=[0, 1], line=15)  # generator loss through D
        t.step(0, line=16)
        t.backward(accumulated=[1], line=18)  # D's own loss
        t.step(1, line=19)
    (finding,) = [f for f in analyze(t.trace)[0] if f.rule == "missing-zero-grad"]
    assert finding.location.line == 18
    assert "are cleared (line 12)" in finding.message and "backward at line 15" in finding.message
    assert [(r.location.line, r.note) for r in finding.related][0] == (
        15, "the backward whose gradients leak into this step")
