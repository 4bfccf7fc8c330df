"""scheduler-orphaned (GD221) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "scheduler-orphaned"


def _run(new_sched=False, old_keeps_stepping=False, other_params=False):
    t = builder()
    sched_init(t, cls="StepLR", args={"step_size": 3}, lrs=(0.1,))
    update(t)
    sched_step(t, cls="StepLR", lrs=[0.1])
    t.optimizer(1, [5, 6] if other_params else [0, 1], line=40, cls="SGD")
    if new_sched:
        sched_init(t, sched=1, opt=1, cls="StepLR", lrs=(0.1,))
    for _ in range(4):
        update(t, opt=1, lr=0.1)
        if old_keeps_stepping:
            update(t, opt=0)
        sched_step(t, cls="StepLR", lrs=[0.05])
        if new_sched:
            sched_step(t, sched=1, opt=1, cls="StepLR", lrs=[0.05])
    return t


def test_a_scheduler_left_on_the_replaced_optimizer_is_a_warning_at_the_rebuild():
    f = only(_run(), SLUG)
    assert (f.location.line, f.severity) == (40, Severity.WARNING)
    assert "at lr 0.1" in f.message and "4 steps" in f.message
    assert any(r.location.line == 5 for r in f.related)


def test_silent_with_a_scheduler_for_the_new_one_two_live_optimizers_or_another_model():
    assert findings(_run(new_sched=True), SLUG) == []
    assert findings(_run(old_keeps_stepping=True), SLUG) == []
    assert findings(_run(other_params=True), SLUG) == []


def test_silent_when_the_script_points_the_scheduler_at_the_new_optimizer():
    from graddoctor import events as ev

    t = builder()
    sched_init(t, cls="StepLR", lrs=(0.1,))
    update(t)
    t.optimizer(1, [0, 1], line=40)
    for _ in range(3):
        update(t, opt=1)
        t.put(ev.scheduler_step(sched=0, cls="StepLR", opt=1, lrs=[0.05]), 30)
    assert findings(t, SLUG) == []
