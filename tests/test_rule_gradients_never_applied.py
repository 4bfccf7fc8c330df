"""gradients-never-applied (GD290): an optimizer keeps stepping while none of its steps
applies a gradient a backward computed (each backward's gradients cleared before a step)."""

from __future__ import annotations

from rule_traces import P, builder, epoch, findings

SLUG = "gradients-never-applied"


def _epochs(t, n=2, steps=3, clear_first=True):
    """zero_grad at the top of each epoch, steps in the batch loop, one backward after it."""
    for e in range(n):
        if clear_first:
            t.clear(P, line=14)
        epoch(t, e, line=16)
        for _ in range(steps):
            t.step(line=19, without_grad=list(P))
        t.backward(fresh=P, line=20)


def test_steps_in_the_batch_loop_with_a_backward_per_epoch_are_reported_at_the_step():
    t = builder()
    _epochs(t)
    [f] = findings(t, SLUG)
    assert f.location.line == 19 and f.severity.value == "error"
    assert [r.location.line for r in f.related] == [20, 14]
    assert "none of the 3 steps" in f.message and "never trains" in f.message
    assert f.evidence["grads_none"] is True


def test_the_usual_loop_and_an_accumulation_over_the_epoch_are_silent():
    t = builder()
    for e in range(3):
        epoch(t, e, line=5)
        for _ in range(3):
            t.clear(P, line=6)
            t.backward(fresh=P, line=8)
            t.step(line=9)
    assert findings(t, SLUG) == []
    t = builder()
    for e in range(3):
        t.clear(P, line=6)
        epoch(t, e, line=7)
        t.backward(fresh=P, line=8)
        t.backward(accumulated=P, line=8)
        t.step(line=10)
    assert findings(t, SLUG) == []


def test_one_step_after_the_backward_or_no_clear_between_them_is_silent():
    t = builder()
    _epochs(t, n=1)
    t.clear(P, line=14)
    t.step(line=19, without_grad=list(P))  # the replay ended after one more step
    assert findings(t, SLUG) == []
    t = builder()
    _epochs(t, n=2, clear_first=False)  # nothing clears: the steps after the backward apply it
    assert findings(t, SLUG) == []


def test_parameters_another_optimizer_also_steps_are_left_alone():
    t = builder()
    t.optimizer(1, P, line=2)
    _epochs(t)
    assert findings(t, SLUG) == []
