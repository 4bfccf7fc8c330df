"""scheduler-before-optimizer (GD206) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only


def sched(t, line=None, opt=0, cls="StepLR"):
    return t.event("scheduler_step", line, sched=0, cls=cls, opt=opt)


def test_scheduler_before_first_step_found():
    t = builder()
    for e in range(3):
        sched(t, line=90)
        for _ in range(2):
            t.clear(P)
            t.backward(fresh=P)
            t.step(line=94)
    f = only(t, "scheduler-before-optimizer")
    assert f.location.line == 90 and f.severity is Severity.WARNING
    assert f.related[0].location.line == 94


def test_scheduler_after_step_skipped_step_and_plateau_are_silent():
    t = builder()
    for _ in range(3):  # OneCycleLR after every step
        t.clear(P)
        t.backward(fresh=P)
        t.step()
        sched(t, cls="OneCycleLR")
    assert findings(t, "scheduler-before-optimizer") == []
    t = builder()
    t.backward(fresh=P)
    t.step(skipped=True)  # GradScaler skipped the first step
    sched(t)
    t.clear(P)
    t.backward(fresh=P)
    t.step()
    assert findings(t, "scheduler-before-optimizer") == []
    t = builder()
    sched(t, cls="ReduceLROnPlateau")
    t.backward(fresh=P)
    t.step()
    assert findings(t, "scheduler-before-optimizer") == []


def test_a_fresh_scheduler_fast_forwarded_before_training_is_silent():
    t = builder()
    for _ in range(3):  # `for _ in range(start_epoch): scheduler.step()` on resuming
        sched(t, line=80)
    for e in range(2):
        for _ in range(2):
            t.clear(P)
            t.backward(fresh=P)
            t.step(line=94)
        sched(t, line=96)
    assert findings(t, "scheduler-before-optimizer") == []


def test_a_fast_forwarded_scheduler_stepped_once_per_update_is_not_stepped_twice():
    t = builder()
    for _ in range(6):
        sched(t, line=80)
    for _ in range(5):
        t.clear(P)
        t.backward(fresh=P)
        t.step(line=94)
        sched(t, line=96)
    assert findings(t, "scheduler-stepped-twice") == []
