"""scheduler-stepped-in-evaluation (GD297) on hand-written traces: a scheduler stepped once per
batch of an evaluation loop (several step() calls from one line under no_grad between two
optimizer steps, no backward among them)."""

from __future__ import annotations

from lr_traces import builder, sched_init, sched_step, update
from rule_traces import findings

SLUG = "scheduler-stepped-in-evaluation"


def _run(per_eval=4, grad=False, lines=None, epochs=3, updates=5, cls="StepLR", backward_between=False,
         before_first=False):
    t = builder()
    sched_init(t, cls=cls, args={"step_size": 2}, lrs=(0.1,), line=3)
    if before_first:
        for _ in range(per_eval):
            sched_step(t, cls=cls, line=6, grad=grad)
    for _ in range(epochs):
        for _ in range(updates):
            update(t)
        for k in range(per_eval):
            if backward_between and k:
                t.backward(fresh=[0], line=20)
            sched_step(t, cls=cls, line=(lines[k % len(lines)] if lines else 25), grad=grad,
                       lrs=(0.05,))
    return t.trace


def test_stepped_per_validation_batch():
    found = findings(_run(), SLUG)
    assert len(found) == 1
    f = found[0]
    assert f.location.line == 25 and "4 times in a row under torch.no_grad()" in f.message
    assert "0.05" in f.message and f.evidence["evaluations"] == 2  # the last one: no step after it


def test_silent_look_alikes():
    assert findings(_run(per_eval=1), SLUG) == []  # once per epoch
    assert findings(_run(grad=True), SLUG) == []  # gradients on: not an evaluation pass
    assert findings(_run(lines=(25, 26)), SLUG) == []  # two lines: two schedulers' worth
    assert findings(_run(backward_between=True), SLUG) == []  # a backward between: training
    assert findings(_run(cls="ReduceLROnPlateau"), SLUG) == []
    assert findings(_run(epochs=1), SLUG) == []  # after the last optimizer step: never applied


def test_steps_before_the_first_optimizer_step_are_no_evaluation():
    trace = _run(epochs=1, before_first=True)
    assert findings(trace, SLUG) == []
