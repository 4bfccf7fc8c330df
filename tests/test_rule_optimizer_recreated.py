"""optimizer-recreated (GD112) on hand-written traces: a stateful optimizer built again at one
line over the same parameters, each stepped once. No torch."""

from __future__ import annotations

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules.optimizer_recreated import OptimizerRecreated
from graddoctor.trace import TraceBuilder


def check(t):
    return list(OptimizerRecreated().check(Analysis(t.trace)))


def loop(t, n=4, cls="Adam", steps_each=1, params=lambda i: [0, 1], line=lambda i: 7):
    for i in range(n):
        t.optimizer(i, params(i), line=line(i), cls=cls)
        for _ in range(steps_each):
            t.clear(params(i), opt=i, line=8)
            t.backward(fresh=params(i), line=9)
            t.step(i, line=10)


def test_adam_rebuilt_every_step_is_a_warning_at_its_construction():
    t = TraceBuilder()
    loop(t)
    [f] = check(t)
    assert f.location.line == 7 and f.severity == Severity.WARNING
    assert "4 times" in f.message and f.evidence["constructions"] == 4


def test_a_restart_per_stage_stepped_many_times_is_silent():
    t = TraceBuilder()
    loop(t, n=3, steps_each=3)
    assert check(t) == []


def test_plain_sgd_two_rebuilds_new_parameters_or_other_lines_are_silent():
    for kw in ({"cls": "SGD"}, {"n": 2}, {"params": lambda i: [2 * i, 2 * i + 1]},
               {"line": lambda i: 7 + 10 * i}):
        t = TraceBuilder()
        loop(t, **kw)
        assert check(t) == [], kw
