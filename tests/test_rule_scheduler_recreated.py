"""scheduler-recreated (GD226): hand-written traces of schedulers built in the loop."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import builder, findings, only

SLUG = "scheduler-recreated"


def _loop(init_lr, after_steps, builds=4, steps_each=2, cls="LambdaLR", args=None, opt_of=None):
    """``builds`` schedulers from line 5, each stepped ``steps_each`` times; the lr a new one
    sets is ``init_lr(i)``, the lr the i-th reaches after its k-th step ``after_steps(i, k)``."""
    t = builder(cls="AdamW")
    for i in range(builds):
        opt = opt_of(i) if opt_of else 0
        if opt != 0:
            t.optimizer(opt, [0, 1], line=4, cls="AdamW")
        t.put(ev.scheduler_init(sched=i, cls=cls, opt=opt, args=dict(args or {}),
                                base_lrs=[1e-3], lrs=[init_lr(i)]), 5)
        for k in range(steps_each):
            t.clear([0, 1], opt=opt, line=6)
            t.backward(fresh=[0, 1], line=7)
            t.step(opt, line=8)
            t.put(ev.scheduler_step(sched=i, cls=cls, opt=opt, lrs=[after_steps(i, k)]), 9)
    return t


def test_a_warmup_rebuilt_every_step_that_sets_the_lr_back_is_a_warning_at_the_constructor():
    f = only(_loop(lambda i: 1e-5, lambda i, k: 1e-5 * (k + 2), args={"total_iters": 100}), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert f.evidence["built"] == 4 and f.evidence["steps_per_scheduler"] == [2, 2, 2]
    assert abs(f.evidence["lr_reached"] - 3e-5) < 1e-12 and f.evidence["lr_rebuilt"] == 1e-5
    assert "AdamW" in f.message and "4 times" in f.message


def test_silent_when_each_rebuild_continues_from_the_lr_it_finds():
    # StepLR / ExponentialLR: construction keeps the current lr
    lrs = {}

    def after(i, k):
        lrs[(i, k)] = 1e-3 * 0.5 ** (2 * i + k + 1)
        return lrs[(i, k)]

    assert findings(_loop(lambda i: 1e-3 * 0.5 ** (2 * i), after, cls="StepLR"), SLUG) == []


def test_silent_when_each_scheduler_runs_its_whole_cycle():
    trace = _loop(lambda i: 1e-3, lambda i, k: 1e-4 if k == 1 else 5e-4, cls="CosineAnnealingLR",
                  args={"T_max": 2})
    assert findings(trace, SLUG) == []


def test_one_rebuild_is_a_stage_change_and_a_new_optimizer_each_time_is_another_rule():
    assert findings(_loop(lambda i: 1e-5, lambda i, k: 2e-5, builds=2), SLUG) == []
    assert findings(_loop(lambda i: 1e-5, lambda i, k: 2e-5, opt_of=lambda i: i), SLUG) == []


def test_silent_when_the_scheduler_is_never_stepped_between_rebuilds():
    t = builder(cls="AdamW")
    for i in range(4):
        t.put(ev.scheduler_init(sched=i, cls="LambdaLR", opt=0, args={}, base_lrs=[1e-3],
                                lrs=[1e-5]), 5)
        t.clear([0, 1], line=6)
        t.backward(fresh=[0, 1], line=7)
        t.step(line=8)
    assert findings(t, SLUG) == []
