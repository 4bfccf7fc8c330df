"""scheduler-stepped-twice (GD136) on hand-written traces, and how it splits the cases with
scheduler-per-micro-batch."""

from __future__ import annotations

from graddoctor import events as ev
from lr_traces import P, builder, sched_init, sched_step
from rule_traces import findings, fold_hard

SLUG = "scheduler-stepped-twice"


def _run(step_lines=(13, 14), backwards=1, updates=6, cls="CosineAnnealingLR", args=None,
         parent=False):
    t = builder()
    sched_init(t, cls=cls, args={"T_max": 1000} if args is None else args, lrs=(0.1,), line=3)
    if parent:
        t.put(ev.scheduler_init(sched=1, cls="SequentialLR", opt=0, args={}, children=[0],
                                base_lrs=[0.1], lrs=[0.1]), 4)
    for _ in range(updates):
        t.clear(P, line=10)
        for _ in range(backwards):
            t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[0.1]), 12)
        t.step(0, line=12)
        for line in step_lines:
            sched_step(t, cls=cls, line=line)
    return t.trace


def test_two_step_calls_per_update():
    found = findings(_run(), SLUG)
    assert len(found) == 1
    f = found[0]
    assert f.location.line == 14 and "2 times per step of SGD (from 2 lines)" in f.message
    assert [r.location.line for r in f.related][:1] == [13] and "1/2 of the updates" in f.message


def test_one_line_called_twice():
    f = findings(_run(step_lines=(13, 13)), SLUG)[0]
    assert f.location.line == 13 and "from this one line" in f.message


def test_per_micro_batch_is_the_other_rules():
    trace = _run(step_lines=(13, 13), backwards=2)
    assert findings(trace, SLUG) == []
    assert [f.rule for f in findings(trace, "scheduler-per-micro-batch")] == ["scheduler-per-micro-batch"]
    # stepped twice per backward: not micro-batches, this rule's
    assert findings(_run(), "scheduler-per-micro-batch") == []


def test_silent_look_alikes():
    assert findings(_run(step_lines=(13,)), SLUG) == []  # once per update
    assert findings(_run(updates=2), SLUG) == []  # too few updates to tell
    assert findings(_run(cls="ReduceLROnPlateau", args={}), SLUG) == []
    assert findings(_run(parent=True), SLUG) == []  # stepped by a SequentialLR


def test_folding_keeps_the_finding():
    trace = _run(updates=12)
    assert [f.message for f in findings(fold_hard(trace), SLUG)] == [f.message for f in findings(trace, SLUG)]
