"""scheduler-overridden (GD224) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "scheduler-overridden"


def _run(read_after_change, changes=3, cls="ExponentialLR"):
    """Each update reads the lr ``read_after_change(k, scheduled)`` after the k-th change."""
    t = builder()
    sched_init(t, cls=cls, lrs=(0.1,), base=(0.1,))
    update(t, lr=0.1)
    lr = 0.1
    for k in range(changes):
        scheduled = lr * 0.5
        sched_step(t, cls=cls, lrs=[scheduled], line=30)
        lr = read_after_change(k, scheduled)
        update(t, lr=lr)
    return t


def test_every_change_set_back_to_the_old_lr_is_a_warning():
    f = only(_run(lambda k, s: 0.1), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 30
    assert "0.05" in f.message and "back to 0.1" in f.message and "3 times" in f.message
    assert f.evidence["undone"] == 3


def test_silent_when_the_schedule_reaches_a_step():
    assert findings(_run(lambda k, s: s), SLUG) == []
    # overridden while warming up, then the scheduler's values are read
    assert findings(_run(lambda k, s: 0.1 if k == 0 else s), SLUG) == []


def test_silent_when_the_script_writes_values_of_its_own():
    # a warm-up or a scaled schedule: neither the scheduler's value nor the one before
    assert findings(_run(lambda k, s: 0.02 * (k + 1)), SLUG) == []
    assert findings(_run(lambda k, s: s * 3), SLUG) == []


def test_silent_when_the_scheduler_changes_nothing_or_is_never_read():
    t = builder()
    sched_init(t, cls="StepLR", lrs=(0.1,))
    for _ in range(3):
        update(t, lr=0.1)
        sched_step(t, cls="StepLR", lrs=[0.1])
    assert findings(t, SLUG) == []
    t = builder()
    sched_init(t, cls="StepLR", lrs=(0.1,))
    update(t, lr=0.1)
    sched_step(t, cls="StepLR", lrs=[0.01])  # the run ends before any step reads it
    assert findings(t, SLUG) == []
