"""scheduler-per-micro-batch (GD222) on hand-written traces, and scheduler-before-optimizer
leaving such a scheduler to it."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, loader_run, sched_init
from rule_traces import findings, only

SLUG = "scheduler-per-micro-batch"


def _run(args, accum=4, cls="CosineAnnealingLR"):
    t = builder()
    sched_init(t, cls=cls, args=args, lrs=(0.1,))
    loader_run(t, batches=16, replay_len=16, per_batch=(0, cls), accum=accum)
    return t


def test_k_steps_per_update_is_a_warning_at_the_scheduler_step():
    f = only(_run({"T_max": 12}), SLUG)
    assert (f.location.line, f.severity) == (14, Severity.WARNING)
    assert "about 4 times" in f.message and "counts SGD's updates" in f.message
    assert "1/4" in f.message  # 12 = 4 updates per replayed epoch x 3: sized in updates


def test_unknown_length_still_found():
    assert only(_run({}, cls="LambdaLR"), SLUG).evidence["length"] is None


def test_silent_when_sized_in_micro_batches_or_without_accumulation():
    assert findings(_run({"total_steps": 48}, cls="OneCycleLR"), SLUG) == []
    assert findings(_run({"T_max": 12}, accum=1), SLUG) == []


def test_scheduler_before_optimizer_does_not_report_it_twice():
    t = _run({"T_max": 12})
    assert findings(t, "scheduler-before-optimizer") == []


def test_under_accelerate_the_fix_is_to_prepare_the_scheduler(monkeypatch):
    """A raw scheduler under accelerate's accumulation: the fix in accelerate's terms (the
    prepared scheduler advances only when the gradients sync), not "move the call"."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed")
    from conftest import FIXTURES
    from test_fixtures import options_for, reset_accelerate_state
    from graddoctor.run.session import run_check

    reset_accelerate_state()
    name = "bad_accelerate_scheduler_per_micro_batch.py"
    monkeypatch.chdir(os.path.join(FIXTURES, "frameworks"))
    (f,) = [f for f in run_check(options_for(name, [])).findings if f.rule == SLUG]
    assert "accelerator.prepare()" in f.fix and "inside the accumulation boundary" not in f.fix


def test_under_accelerate_a_step_inside_accumulate_points_at_prepare(monkeypatch):
    """The raw scheduler is stepped where accelerate's examples step the prepared one (inside
    `with accelerator.accumulate(...)`): the line to change is the prepare call that leaves it
    out, with the step() beside it."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed")
    from conftest import FIXTURES
    from test_fixtures import options_for, reset_accelerate_state
    from graddoctor.run.session import run_check

    reset_accelerate_state()
    name = "bad_accelerate_scheduler_left_out_of_prepare.py"
    monkeypatch.chdir(os.path.join(FIXTURES, "frameworks"))
    (f,) = [f for f in run_check(options_for(name, [])).findings if f.rule == SLUG]
    assert f.location.line == 17 and f.related[0].location.line == 24
    assert "accelerator.prepare()" in f.fix
