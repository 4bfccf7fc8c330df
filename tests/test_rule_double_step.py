"""double-step (GD108) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only, plain_update


def test_double_step_points_at_the_second_step_and_names_the_first():
    t = builder()
    for _ in range(3):
        plain_update(t)
        t.step(0, line=13)
    f = only(t, "double-step")
    assert (f.location.line, f.severity) == (13, Severity.ERROR)
    assert [r.location.line for r in f.related] == [12]
    assert f.evidence["occurrences"] == 3 and not f.evidence["via_scaler"]
    assert "line 12" in f.message and "a second time" in f.message


def test_double_step_after_scaler_step_says_so():
    t = builder()
    plain_update(t, step_line=12)
    t.put(ev.scaler_step(scaler=0, opt=0, enabled=True, fused=False, skipped=False,
                         found_inf=False), 12)
    t.step(0, line=13)
    f = only(t, "double-step")
    assert f.evidence["via_scaler"] and "scaler.step(SGD)" in f.message


def test_a_plain_step_after_a_step_the_scaler_skipped_bypasses_the_scaler():
    t = builder()
    plain_update(t)
    t.put(ev.step(opt=0, skipped=True), 12)  # GradScaler found inf/NaN
    t.step(0, line=13)
    f = only(t, "double-step")
    assert f.location.line == 13 and "bypassing the scaler" in f.message
    assert f.evidence["first_skipped"]


def test_a_second_step_the_scaler_skipped_applies_nothing():
    t = builder()
    plain_update(t)
    t.put(ev.step(opt=0, skipped=True), 13)
    assert findings(t, "double-step") == []


def test_double_step_silent_when_anything_touches_the_gradients_between():
    for between in ("backward", "partial_backward", "clear", "module_clear", "grad_edit"):
        t = builder()
        plain_update(t)
        if between == "backward":
            t.backward(accumulated=P, line=14)
        elif between == "partial_backward":
            t.backward(accumulated=[1], line=14)
        elif between == "clear":
            t.clear(P, opt=0, line=14)
        elif between == "module_clear":
            t.clear([0], opt=None, line=14)
        else:
            t.put(ev.grad_edit(opt=0, params=P), 14)
        t.step(0, line=15)
        assert findings(t, "double-step") == [], between


def test_double_step_silent_on_closure_steps_and_disjoint_optimizers():
    t = builder()
    for _ in range(3):  # L-BFGS: every step re-evaluates inside its closure
        t.put(ev.step_begin(opt=0, closure=True, norm_pids=[], norms=[]), 5)
        t.backward(fresh=P, line=6, in_step=0)
        t.step(0, line=5, closure=True)
        t.step(0, line=5, closure=True)
    assert findings(t, "double-step") == []
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    for _ in range(3):  # a GAN-like pair, or two scaler.step calls sharing one GradScaler
        t.backward(fresh=P, line=10)
        t.step(0, line=11)
        t.step(1, line=12)
        t.clear([0], opt=0)
        t.clear([1], opt=1)
    assert findings(t, "double-step") == []


def test_double_step_needs_gradients_in_the_second_step():
    t = builder()
    t.step(0, line=3, without_grad=P)  # stepped before the loop: nothing to apply
    t.step(0, line=4, without_grad=P)
    assert findings(t, "double-step") == []


def test_double_step_still_found_when_a_backward_only_writes_another_optimizer():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    t.backward(fresh=P, line=10)
    t.step(0, line=11)
    t.backward(fresh=[1], line=12)  # another model's loss
    t.step(0, line=13)
    assert only(t, "double-step").location.line == 13
