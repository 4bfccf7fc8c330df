"""scheduler-period-mismatch (GD223) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, loader_run, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "scheduler-period-mismatch"


def _per_batch(cls, args, real_len=40):
    t = builder()
    sched_init(t, cls=cls, args=args, lrs=(0.1,))
    loader_run(t, per_batch=(0, cls), real_len=real_len)
    return t


def _per_epoch(cls, args, real_len=40):
    t = builder()
    sched_init(t, cls=cls, args=args, lrs=(0.1,))
    loader_run(t, per_epoch=(0, cls), real_len=real_len)
    return t


def test_cosine_period_in_epochs_stepped_per_batch():
    f = only(_per_batch("CosineAnnealingLR", {"T_max": 5}), SLUG)  # passed in the replay
    assert (f.location.line, f.severity) == (5, Severity.WARNING) and "within the replay" in f.message
    f = only(_per_batch("CosineAnnealingLR", {"T_max": 50}, real_len=400), SLUG)  # projected
    assert f.severity is Severity.WARNING and "projected" in f.message


def test_decays_meant_per_epoch_are_info():
    assert only(_per_batch("MultiStepLR", {"milestones": [30, 60, 90], "gamma": 0.1}, real_len=400),
                SLUG).severity is Severity.INFO
    assert only(_per_batch("StepLR", {"step_size": 10, "gamma": 0.5}, real_len=400),
                SLUG).severity is Severity.INFO


def test_length_in_batches_stepped_per_epoch():
    f = only(_per_epoch("CosineAnnealingLR", {"T_max": 17}), SLUG)  # len(loader) in the replay
    assert "once per epoch" in f.message and f.severity is Severity.WARNING
    assert only(_per_epoch("OneCycleLR", {"total_steps": 17 * 100}), SLUG)  # epochs * len(loader)


def test_silent_look_alikes():
    assert findings(_per_batch("CosineAnnealingLR", {"T_max": 17 * 30}), SLUG) == []
    assert findings(_per_epoch("CosineAnnealingLR", {"T_max": 30}), SLUG) == []
    assert findings(_per_batch("OneCycleLR", {"total_steps": 40 * 3}), SLUG) == []
    assert findings(_per_batch("LinearLR", {"total_iters": 5}), SLUG) == []  # a short warm-up
    assert findings(_per_batch("StepLR", {"step_size": 1000, "gamma": 0.1}, real_len=400), SLUG) == []
    # no DataLoader, a period longer than the replay: nothing to judge by
    t = builder()
    sched_init(t, cls="CosineAnnealingLR", args={"T_max": 50}, lrs=(0.1,))
    for _ in range(10):
        update(t)
        sched_step(t, cls="CosineAnnealingLR")
    assert findings(t, SLUG) == []


def test_a_cosine_sized_with_the_replayed_len_loader_and_passed_in_the_replay_is_silent():
    # T_max = epochs * len(loader) = 2 * 17 in the replay, whose 35 steps pass it: by design
    t = builder()
    sched_init(t, cls="CosineAnnealingLR", args={"T_max": 34}, lrs=(0.1,))
    loader_run(t, epochs=3, per_batch=(0, "CosineAnnealingLR"))
    assert findings(t, SLUG) == []


def test_per_epoch_length_equal_to_the_real_epoch_only_is_chance_not_len_loader():
    # the replay shortened epochs to 17 batches; T_max=40 equals the real length 40: a count of
    # epochs that happens to match (len(loader) would have returned 17 in the replay)
    assert findings(_per_epoch("CosineAnnealingLR", {"T_max": 40}), SLUG) == []


def test_a_cosine_over_a_step_budget_inside_a_long_epoch_is_not_taken_for_epochs():
    # LLM-style: T_max = max_steps, stepped per batch, the loop stops at max_steps long before
    # the (huge) epoch ends: nothing says T_max counts epochs
    assert findings(_per_batch("CosineAnnealingLR", {"T_max": 2000}, real_len=50000), SLUG) == []


def test_each_schedule_gets_the_fix_of_its_own_arguments():
    """The fix names what the script can change: milestones for MultiStepLR, step_size for
    StepLR, T_max only for the cosine schedule."""
    milestones = only(_per_batch("MultiStepLR", {"milestones": [30, 60, 90], "gamma": 0.1},
                                 real_len=400), SLUG)
    assert "milestones" in milestones.fix and "T_max" not in milestones.fix
    step = only(_per_batch("StepLR", {"step_size": 10, "gamma": 0.5}, real_len=400), SLUG)
    assert "step_size" in step.fix and "T_max" not in step.fix
    assert "T_max" in only(_per_batch("CosineAnnealingLR", {"T_max": 5}), SLUG).fix
