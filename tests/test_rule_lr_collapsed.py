"""lr-collapsed (GD134) on hand-written traces: the lr each step read, the scheduler that wrote
it, and whether graddoctor stopped a script that was still stepping."""

from __future__ import annotations

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from lr_traces import P, sched_init, sched_step
from rule_traces import fold_hard

SLUG = "lr-collapsed"


def _run(lrs, cls="StepLR", start=0.1, status="step-limit", base=None, sched=True, manual_line=None):
    """An optimizer built with lr ``start``; after each update its scheduler (``cls``) writes the
    next lr of ``lrs`` (the first is what the first step reads); ``manual_line``: the script
    writes them itself instead."""
    t = TraceBuilder()
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=list(P), lrs=[start]), 2)
    if sched:
        sched_init(t, cls=cls, args={}, lrs=(lrs[0],), base=(start if base is None else base,), line=3)
    for i, lr in enumerate(lrs):
        if manual_line is not None and i:
            pass  # the script wrote it: no event
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 12)
        t.step(0, line=12)
        if sched and i + 1 < len(lrs):
            sched_step(t, cls=cls, lrs=(lrs[i + 1],), line=13)
    if status is not None:
        t.put(ev.run_end(status=status, steps=len(lrs)))
    return t.trace


def _found(trace):
    return list(find_rule(SLUG)().check(Analysis(trace)))


def test_a_decay_per_batch_that_collapsed_while_the_script_steps():
    found = _found(_run([0.1 * 0.1 ** i for i in range(10)]))
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    f = found[0]
    assert f.location.line == 3 and "fell from 0.1 to" in f.message and "still stepping" in f.message
    assert f.evidence["observed"] is True and f.evidence["writer"] == "StepLR"
    assert "once per epoch" in f.fix


def test_a_steep_steady_fall_is_projected():
    f = _found(_run([0.1 * 0.5 ** i for i in range(10)], cls="ExponentialLR"))[0]
    # 0.5 ** 9 = 2e-3 of the start after 10 updates: below 1e-4 by update 15
    assert f.evidence["observed"] is False and f.evidence["projected_at"] == 15
    assert "by update 15" in f.message


def test_after_a_warm_up_the_start_is_the_base_lr():
    lrs = [0.1 * (i + 1) / 5 for i in range(5)] + [0.1 * 0.01 ** i for i in range(1, 6)]
    f = _found(_run(lrs, cls="LambdaLR"))[0]
    assert f.evidence["start"] == 0.1 and f.evidence["observed"] is True


@pytest.mark.parametrize("case", [
    dict(lrs=[0.1 * 0.1 ** i for i in range(10)], status="completed"),  # the run ended on its own
    dict(lrs=[0.1 * 0.1 ** i for i in range(10)], status=None),  # a provisional report
    dict(lrs=[0.1 * 0.1 ** i for i in range(10)], cls="ReduceLROnPlateau"),  # a metric's drops
    dict(lrs=[0.1 * 0.1 ** i for i in range(10)], cls="OneCycleLR"),
    dict(lrs=[0.1 * 0.7 ** i for i in range(10)], cls="ExponentialLR"),  # 4e-2: not steep yet
    dict(lrs=[1e-7 * 10 ** i for i in range(7)], cls="LinearLR", start=0.1),  # a warm-up from 1e-6
    # a schedule with a floor, 100x down: not projected (MultiStepLR's milestones passed)
    dict(lrs=[0.1] * 3 + [1e-3] * 7, cls="MultiStepLR"),
    dict(lrs=[0.1 * 0.1 ** i for i in range(3)]),  # too few updates
    dict(lrs=[0.0] * 8, cls="LambdaLR"),  # a warm-up whose factor is still 0: it never rose
])
def test_silent(case):
    assert _found(_run(**case)) == []


def test_not_projected_when_it_rose_again():
    lrs = [0.1, 0.05, 0.2, 0.05, 0.01, 0.005, 0.002, 0.0008]
    assert _found(_run(lrs, cls="LambdaLR")) == []


def test_the_script_setting_0_itself_is_not_judged():
    assert _found(_run([0.1] + [0.0] * 6, sched=False, manual_line=9)) == []
    found = _found(_run([0.1 * 0.1 ** i for i in range(8)], sched=False, manual_line=9))
    assert len(found) == 1 and found[0].evidence["writer"] == "manual"


def test_folding_keeps_the_verdict():
    trace = _run([0.1 * 0.1 ** i for i in range(12)])
    assert [f.message for f in _found(fold_hard(trace))] == [f.message for f in _found(trace)]
    trace = _run([0.1 * 0.5 ** i for i in range(12)], cls="ExponentialLR")
    assert [f.message for f in _found(fold_hard(trace))] == [f.message for f in _found(trace)]



def _lightning_run(stepped_by_lightning: bool):
    """A per-epoch decay stepped every batch in a Lightning run: the scheduler's steps made by
    Lightning itself (its "interval": "step" config, attributed to configure_optimizers) or by
    the user's own sch.step() under manual optimization."""
    from graddoctor.rules.engine import analyze

    t = TraceBuilder()
    t._params(P)
    t.via = "lightning"
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=list(P), lrs=[0.1]), 2)
    sched_init(t, cls="StepLR", args={}, lrs=(0.1,), base=(0.1,), line=3)
    lrs = [0.1 * 0.1 ** i for i in range(10)]
    for i, lr in enumerate(lrs):
        t.hook = ""
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 12)
        t.step(0, line=12)
        if i + 1 < len(lrs):
            t.hook = "configure_optimizers" if stepped_by_lightning else ""
            sched_step(t, cls="StepLR", lrs=(lrs[i + 1],), line=4 if stepped_by_lightning else 13)
    t.hook = ""
    t.put(ev.run_end(status="step-limit", steps=len(lrs)))
    return [f for f in analyze(Analysis(t.trace))[0] if f.rule == SLUG]


def test_a_schedule_lightning_steps_gets_the_interval_fix():
    (f,) = _lightning_run(stepped_by_lightning=True)
    assert '"interval": "epoch"' in f.fix and "estimated_stepping_batches" in f.fix


def test_a_schedule_the_user_steps_under_lightning_keeps_the_step_fix():
    (f,) = _lightning_run(stepped_by_lightning=False)
    assert "interval" not in f.fix and "once per epoch" in f.fix


def _stepped_per_batch_and_per_epoch(cls="StepLR", batches=4, epochs=3):
    """A scheduler stepped after every update at line 13 and once more at each epoch's end at
    line 15, its lr divided by 10 at each of its steps."""
    t = TraceBuilder()
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=list(P), lrs=[0.1]), 2)
    lr = 0.1
    sched_init(t, cls=cls, args={}, lrs=(lr,), base=(0.1,), line=3)
    for _ in range(epochs):
        for _ in range(batches):
            t.clear(P, line=10)
            t.backward(fresh=P, line=11)
            t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 12)
            t.step(0, line=12)
            lr *= 0.1
            sched_step(t, cls=cls, lrs=(lr,), line=13)
        lr *= 0.1
        sched_step(t, cls=cls, lrs=(lr,), line=15)
    t.put(ev.run_end(status="step-limit", steps=batches * epochs))
    return t.trace


def test_a_scheduler_also_stepped_per_batch_is_reported_at_that_step():
    f = _found(_stepped_per_batch_and_per_epoch())[0]
    assert f.location.line == 13 and "once per epoch at line 15" in f.message
    assert "remove this per-batch step()" in f.fix
    assert sorted(r.location.line for r in f.related) == [3, 15]


def test_a_schedule_not_counted_in_epochs_stepped_at_two_lines_keeps_the_construction():
    f = _found(_stepped_per_batch_and_per_epoch(cls="LambdaLR"))[0]
    assert f.location.line == 3


def test_a_lambda_lr_given_a_function_of_the_script_points_at_its_return(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules.lr_collapsed import _lambda_return
    from graddoctor.trace import Location, TraceBuilder

    script = tmp_path / "train.py"
    script.write_text(
        "def rule(epoch):\n"                                          # 1
        "    return 1.0 - epoch / 10\n"                               # 2
        "sched = LambdaLR(opt, lr_lambda=rule)\n"                     # 3
        "other = LambdaLR(opt, lambda e: 0.5 ** e)\n"                 # 4
        "third = [LambdaLR(o, rule) for o in opts]\n")                # 5
    a = Analysis(TraceBuilder(str(script)).trace)
    assert _lambda_return(a, Location(str(script), 3)) == 2
    assert _lambda_return(a, Location(str(script), 4)) is None      # inline: on the construction
    assert _lambda_return(a, Location(str(script), 5)) == 2


def test_a_decay_that_overtook_its_warm_up_is_projected_from_its_highest_lr():
    # base * min(1, (s + 1) / 10) * 0.5 ** s: the lr never reaches the base, and falls from step 2 on
    lrs = [0.1 * min(1.0, (s + 1) / 10) * 0.5 ** s for s in range(10)]
    found = _found(_run(lrs, sched=False, manual_line=9))
    assert len(found) == 1 and found[0].evidence["observed"] is False
    assert found[0].evidence["start"] == pytest.approx(0.01)
    # a warm-up into a slow decay, and a fast decay held at a floor by the last steps: silent
    slow = [0.1 * min(1.0, (s + 1) / 4) * 0.5 ** (s / 2000) for s in range(10)]
    floored = [max(2e-4, 0.1 * min(1.0, (s + 1) / 4) * 0.4 ** s) for s in range(10)]
    assert _found(_run(slow, sched=False, manual_line=9)) == []
    assert _found(_run(floored, sched=False, manual_line=9)) == []
