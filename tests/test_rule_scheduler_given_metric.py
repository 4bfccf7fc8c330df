"""scheduler-given-metric (GD239): hand-written traces, and what the scheduler watcher records of
step()'s argument (instrument/schedulers.py, ``metric_kind``)."""

from __future__ import annotations

import numpy as np
import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.schedulers import metric_kind
from rule_traces import builder, findings, only

SLUG = "scheduler-given-metric"


def _stepped(cls="StepLR", metric="tensor", calls=3):
    t = builder()
    t.put(ev.scheduler_init(sched=0, cls=cls, opt=0, args={}), line=2)
    for _ in range(calls):
        t.backward(fresh=[0, 1], line=5)
        t.step(line=6)
        t.put(ev.scheduler_step(sched=0, cls=cls, opt=0, lrs=[0.1], metric=metric, grad=False),
              line=7)
    return t


def test_a_loss_given_to_a_scheduler_that_takes_no_metric_is_a_warning_at_that_call():
    f = only(_stepped(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "StepLR.step() takes no metric" in f.message and f.evidence["calls"] == 3
    assert "ReduceLROnPlateau" in f.fix


def test_silent_on_plateau_integer_epochs_fractional_restarts_and_the_script_s_own_class():
    assert findings(_stepped(cls="ReduceLROnPlateau", metric="number"), SLUG) == []
    assert findings(_stepped(metric="integer"), SLUG) == []
    assert findings(_stepped(metric="none"), SLUG) == []
    assert findings(_stepped(cls="CosineAnnealingWarmRestarts", metric="number"), SLUG) == []
    assert findings(_stepped(cls="MyWarmupScheduler", metric="number"), SLUG) == []


def test_metric_kind_tells_an_epoch_index_from_a_metric():
    assert metric_kind((), {}) == "none"
    assert metric_kind((3,), {}) == "integer"
    assert metric_kind((np.int64(3),), {}) == "integer"
    assert metric_kind((), {"epoch": 2}) == "integer"
    assert metric_kind((0.7,), {}) == "number"
    assert metric_kind((True,), {}) == "number"
    assert metric_kind((torch.tensor(0.5),), {}) == "tensor"
    assert metric_kind((torch.tensor(0.5, requires_grad=True),), {}) == "grad_tensor"
