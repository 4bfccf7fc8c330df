"""unscaled-backward-under-scaler (GD217) on hand-written traces: a plain backward whose
gradients an enabled scaler's unscale divides together with scaled ones."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only


def scaled(t, params=P, enabled=True, line=11):
    return t.backward(accumulated=params, line=line, scaled=True, scale=65536.0, scaler=0,
                      scaler_enabled=enabled)


def unscale(t, enabled=True, implicit=True, line=13):
    return t.put(ev.unscale(scaler=0, opt=0, enabled=enabled, implicit=implicit, scale=65536.0), line)


def test_plain_backward_added_to_scaled_grads_is_an_error_at_it():
    t = builder()
    for _ in range(2):
        t.clear(P, line=10)
        scaled(t)
        t.backward(accumulated=P, line=12)
        unscale(t)
        t.step(0, line=13)
    f = only(t, "unscaled-backward-under-scaler")
    assert (f.location.line, f.severity) == (12, Severity.ERROR)
    assert [r.location.line for r in f.related] == [11, 13]
    assert "scaler.step()" in f.message and f.evidence["occurrences"] == 2


def test_plain_backward_first_then_explicit_unscale():
    t = builder()
    t.clear(P, line=10)
    t.backward(accumulated=P, line=9)
    scaled(t)
    unscale(t, implicit=False, line=12)
    f = only(t, "unscaled-backward-under-scaler")
    assert f.location.line == 9 and "scaler.unscale_()" in f.message


def test_cleared_disabled_or_other_params_are_silent():
    t = builder()
    t.backward(accumulated=P, line=9)  # a probe, cleared before the scaled backward
    t.clear(P, line=10)
    scaled(t)
    unscale(t)
    t.step(0, line=13)
    t.clear(P, line=10)
    scaled(t, enabled=False)  # a disabled scaler: nothing is divided
    t.backward(accumulated=P, line=12)
    unscale(t, enabled=False)
    t.step(0, line=13)
    t.param(5)
    t.clear(P, line=10)
    scaled(t)
    t.backward(accumulated=[5], line=12)  # a parameter the unscaled optimizer does not own
    unscale(t)
    t.step(0, line=13)
    assert findings(t, "unscaled-backward-under-scaler") == []
