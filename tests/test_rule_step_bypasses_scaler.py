"""step-bypasses-scaler (GD214) on hand-written traces: reported at the step that applies still
scaled gradients, and silent when scaler.step, unscale_, a fused optimizer or a disabled scaler
explain the step."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, nan_step, only


def scaled_backward(t, enabled=True, line=11):
    return t.backward(fresh=P, line=line, scaled=True, scale=65536.0, scaler=0,
                      scaler_enabled=enabled)


def test_plain_step_after_scaled_backward_is_an_error_at_the_step():
    t = builder()
    for _ in range(3):
        t.clear(P, line=10)
        scaled_backward(t)
        t.step(0, line=12)
    f = only(t, "step-bypasses-scaler")
    assert (f.location.line, f.severity) == (12, Severity.ERROR)
    assert [r.location.line for r in f.related] == [11]
    assert "65536" in f.message and f.evidence["occurrences"] == 3
    assert "scaler.step(optimizer)" in f.fix  # no source to read: the generic names


def test_nan_steps_are_told_and_nonfinite_grad_leaves_them_to_this_rule():
    t = builder()
    t.clear(P, line=10)
    scaled_backward(t)
    t.step(0, line=102)
    t.clear(P, line=10)
    scaled_backward(t)
    nan_step(t)
    f = only(t, "step-bypasses-scaler")
    assert "NaN/Inf from step 2" in f.message and f.evidence["nonfinite_steps"] == 1
    assert findings(t, "nonfinite-grad") == []


def test_scaler_step_unscale_and_fused_steps_are_silent():
    t = builder()
    scaled_backward(t)  # scaler.step(optimizer): the implicit unscale_ comes first
    t.put(ev.unscale(scaler=0, opt=0, enabled=True, implicit=True, scale=65536.0), 12)
    t.step(0, line=12)
    t.put(ev.scaler_step(scaler=0, opt=0, enabled=True, fused=False, skipped=False,
                         found_inf=False), 12)
    t.clear(P)
    scaled_backward(t)  # a fused optimizer unscales inside its own step
    t.step(0, line=12)
    t.put(ev.scaler_step(scaler=0, opt=0, enabled=True, fused=True, skipped=False,
                         found_inf=False), 12)
    t.clear(P)
    scaled_backward(t)  # unscale_ by hand, then a plain step (no inf skipping, but unscaled)
    t.put(ev.unscale(scaler=0, opt=0, enabled=True, implicit=False, scale=65536.0), 12)
    t.step(0, line=13)
    assert findings(t, "step-bypasses-scaler") == []


def test_disabled_scaler_and_skipped_steps_are_silent():
    t = builder()
    scaled_backward(t, enabled=False)
    t.step(0, line=12)
    t.clear(P)
    scaled_backward(t)
    t.step(0, line=12, skipped=True)
    assert findings(t, "step-bypasses-scaler") == []


def test_grads_edited_in_place_before_the_step_lower_it_to_info():
    t = builder()
    scaled_backward(t)
    t.put(ev.grad_edit(opt=0, params=list(P)), 12)  # p.grad.div_(scale) by hand?
    t.step(0, line=12)
    f = only(t, "step-bypasses-scaler")
    assert f.severity is Severity.INFO and "hand-written unscale" in f.message
    t = builder()
    scaled_backward(t)
    t.put(ev.grad_edit(opt=0, params=[0]), 12)  # only one of them: the other is still scaled
    t.step(0, line=12)
    f = only(t, "step-bypasses-scaler")
    assert f.severity is Severity.ERROR and f.evidence["params"] == ["p1"]


def test_a_clear_or_plain_backward_after_the_scaled_one_resets_it():
    t = builder()
    scaled_backward(t)
    t.clear(P)
    t.backward(fresh=P, line=11)
    t.step(0, line=12)
    assert findings(t, "step-bypasses-scaler") == []
