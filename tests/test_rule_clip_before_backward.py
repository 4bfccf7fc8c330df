"""clip-before-backward (GD203) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from rule_traces import P, builder, clip, findings, only


def test_clip_before_backward_found():
    t = builder()
    for _ in range(3):
        t.clear(P, line=30)
        clip(t, line=31)
        t.backward(fresh=P, line=32)
        t.step(line=33)
    f = only(t, "clip-before-backward")
    assert f.location.line == 31 and f.severity is Severity.ERROR
    assert f.evidence["after_step"] is False


def test_clip_after_step_found():
    t = builder()
    for _ in range(3):
        t.clear(P, line=30)
        t.backward(fresh=P, line=31)
        t.step(line=32)
        clip(t, line=33, via="clip_grad_value_")
    f = only(t, "clip-before-backward")
    assert f.location.line == 33 and f.evidence["after_step"] is True
    assert "already applied" in f.message


def test_plain_clip_and_norm_logging_are_silent():
    t = builder()
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=P)
        clip(t)
        t.step()
        clip(t, norm_only=True)  # clip_grad_norm_(params, inf) for logging
    assert findings(t, "clip-before-backward") == []


def test_clip_of_params_that_never_get_grads_is_silent():
    t = builder()
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=[0])
        t.step()
        clip(t, params=[1])  # a frozen part: nothing ever follows
    assert findings(t, "clip-before-backward") == []
