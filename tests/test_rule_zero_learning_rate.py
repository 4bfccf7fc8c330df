"""zero-learning-rate (GD116) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "zero-learning-rate"


def _run(lrs, cls="SGD", scheduler=None, base=(0.0,)):
    t = builder(cls=cls)
    if scheduler:
        sched_init(t, cls=scheduler, lrs=(lrs[0],), base=base)
    for lr in lrs:
        update(t, lr=lr)
        if scheduler:
            sched_step(t, cls=scheduler, lrs=[lr])
    return t


def test_lr_zero_as_built_at_every_update_is_a_warning_at_the_construction():
    f = only(_run([0.0] * 4), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 1
    assert f.evidence["updates"] == 4 and "4 updates" in f.message


def test_a_schedule_over_a_base_lr_of_zero_is_reported_with_it():
    f = only(_run([0.0] * 3, scheduler="CosineAnnealingLR"), SLUG)
    assert "CosineAnnealingLR" in f.message and f.evidence["scheduler"] == "CosineAnnealingLR"


def test_silent_when_the_lr_can_still_rise_or_is_not_used():
    assert findings(_run([0.0, 0.0, 0.01]), SLUG) == []  # a warm-up from 0
    # a factor of 0 for now over a positive base lr (a per-epoch warm-up)
    assert findings(_run([0.0] * 3, scheduler="LambdaLR", base=(0.1,)), SLUG) == []
    assert findings(_run([0.0] * 3, scheduler="OneCycleLR"), SLUG) == []  # sets its own lr
    assert findings(_run([0.0] * 3, cls="MyOptimizer"), SLUG) == []  # may not read "lr"
