"""scheduler-duplicated (GD148): the constructor arguments read from the source, and the
rule over hand-written traces."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis.source import schedule_arguments
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "scheduler-duplicated"

SCRIPT = """\
import torch
sched_g = LambdaLR(opt_g, lr_lambda=warmup)
sched_d = LambdaLR(opt_g, lr_lambda=warmup)
other = LambdaLR(optimizer=opt_g, lr_lambda=decay)
"""


def test_the_arguments_leave_the_optimizer_out(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    assert schedule_arguments(str(path), 2, "LambdaLR") == "lr_lambda=warmup"
    assert schedule_arguments(str(path), 3, "LambdaLR") == "lr_lambda=warmup"
    assert schedule_arguments(str(path), 4, "LambdaLR") == "lr_lambda=decay"
    assert schedule_arguments(str(path), 2, "StepLR") is None


def traced(tmp_path, lines, args=({}, {}), opts=(0, 0), counts=(4, 4), cls="LambdaLR"):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=1)
    for sched, (line, arg, opt) in enumerate(zip(lines, args, opts)):
        t.put(ev.scheduler_init(sched=sched, cls=cls, opt=opt, args=dict(arg), children=[],
                                base_lrs=[0.1], lrs=[0.1]), line)
    for turn in range(max(counts)):
        for opt in (0, 1):
            t.backward(fresh=[opt], line=1)
            t.step(opt, line=1)
        for sched, opt in enumerate(opts):
            if turn < counts[sched]:
                t.put(ev.scheduler_step(sched=sched, cls=cls, opt=opt, lrs=[0.1], metric="none",
                                        grad=True), 5)
    return t


def test_two_lambdas_of_one_text_on_one_optimizer_are_a_warning_at_the_second(tmp_path):
    f = only(traced(tmp_path, (2, 3)), SLUG)
    assert f.location.line == 3 and f.evidence["orphans"] == [1]


def test_schedulers_stepped_once_each_per_epoch_are_enough(tmp_path):
    assert only(traced(tmp_path, (2, 3), counts=(1, 1)), SLUG).location.line == 3


def test_silent_for_other_lambdas_other_optimizers_or_one_scheduler_stepped(tmp_path):
    assert findings(traced(tmp_path, (2, 4)), SLUG) == []  # warmup and decay
    assert findings(traced(tmp_path, (2, 3), opts=(0, 1)), SLUG) == []
    assert findings(traced(tmp_path, (2, 3), counts=(4, 0)), SLUG) == []
    # recorded arguments that differ (two StepLRs of other gammas) on one line
    assert findings(traced(tmp_path, (2, 2), args=({"gamma": 0.5}, {"gamma": 0.9}), cls="StepLR"),
                    SLUG) == []
