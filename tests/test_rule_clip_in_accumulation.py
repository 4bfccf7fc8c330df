"""clip-in-accumulation (GD202) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, clip, findings, only


def test_clip_in_accumulation_found():
    t = builder()
    for window in range(2):
        t.backward(fresh=P, line=20)
        clip(t, line=21)
        for _ in range(3):
            t.backward(accumulated=P, line=20)
            clip(t, line=21)
        t.step(line=23)
        t.clear(P, line=24)
    f = only(t, "clip-in-accumulation")
    assert f.location.line == 21 and f.severity is Severity.WARNING
    assert any(r.location.line == 20 for r in f.related)


def test_clip_once_at_boundary_is_silent():
    t = builder()
    for _ in range(3):
        t.backward(fresh=P, line=20)
        for _ in range(3):
            t.backward(accumulated=P, line=20)
        clip(t, line=22)
        t.step(line=23)
        t.clear(P, line=24)
    assert findings(t, "clip-in-accumulation") == []


def test_gan_generator_backward_after_discriminator_clip_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], cls="Adam")  # D
    t.optimizer(1, [1], cls="Adam")  # G
    for _ in range(3):
        t.clear([0], opt=0)
        t.backward(fresh=[0])
        clip(t, params=[0])
        t.step(0)
        t.clear([1], opt=1)
        t.backward(fresh=[1], accumulated=[0])  # G's loss flows through D too
        t.step(1)
    assert findings(t, "clip-in-accumulation") == []
