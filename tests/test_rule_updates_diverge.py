"""updates-diverge (GD142): the tracker that sees each optimizer's gradient norm grow while
recording (instrument/divergence.py), and the rule over hand-written traces."""

from __future__ import annotations

import math

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.divergence import Divergence
from rule_traces import builder, findings, only

SLUG = "updates-diverge"


class _Rec:
    def __init__(self):
        self.made = []

    def emit_aside(self, made, loc=None):
        self.made.append(made)


def _observe(totals, opt=0):
    rec = _Rec()
    tracker = Divergence(rec)
    for total in totals:
        tracker.observe(opt, None if total is None else [total / math.sqrt(2)] * 2)
    return [data for kind, data in rec.made if kind == "diverging"]


def test_three_updates_growing_tenfold_are_recorded_once():
    [made] = _observe([1.0, 10.0, 100.0, 1000.0, 10000.0, 1e5])
    assert (made["first"], made["last"], made["nonfinite"]) == (1, 4, False)
    assert math.isclose(made["factor"], 10.0) and math.isclose(made["norms"][1], 1000.0)


def test_short_slow_unmeasured_or_recovering_growth_is_not_recorded():
    assert _observe([1.0, 10.0, 100.0]) == []  # two updates of growth
    assert _observe([1.0, 2.5, 6.0, 15.0, 40.0, 100.0]) == []  # < 3x per update
    assert _observe([1.0, 3.0, 9.0, 27.0]) == []  # 27x in all: short of 1000x
    assert _observe([1.0, 10.0, None, 1000.0, 10000.0]) == []  # not measured between
    assert _observe([1.0, 10.0, 100.0, 1.0, 10.0, 100.0]) == []  # it recovers
    assert _observe([0.0, 1.0, 10.0, 100.0]) == []  # a zero-initialised layer coming to life


def test_a_nan_right_after_two_growing_updates_is_recorded_as_nonfinite():
    [made] = _observe([1.0, 10.0, 100.0, math.nan])
    assert made["nonfinite"] and (made["first"], made["last"]) == (1, 3)
    assert _observe([1.0, 10.0, math.inf]) == []  # one update of growth: no evidence


def _trace(terms=("mean",), lr=0.1, nonfinite=False, scaled=False):
    t = builder()
    for i in range(4):
        t.clear([0, 1], line=10)
        t.backward(fresh=[0, 1], line=11, loss_terms=list(terms), scaled=scaled)
        if i == 3:
            t.put(ev.diverging(opt=0, first=1, last=4, norms=[1.0, 1000.0], factor=10.0,
                               nonfinite=nonfinite))
        t.event("step_begin", 12, opt=0, closure=False, norm_pids=[0, 1], norms=[1.0, 1.0],
                nonfinite=[], lrs=[lr])
        t.step(line=12)
    return t


def test_the_rule_reports_at_the_backward_with_the_lr_to_try():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert "grows about 10x per update over its updates 1-4" in f.message
    assert "lr=0.1: try 0.01" in f.fix and "reduction" not in f.fix


def test_a_summed_loss_gets_the_fix_for_its_reduction():
    assert "reduction='sum'" in only(_trace(terms=("sum",)), SLUG).fix


def test_nan_runs_and_growth_with_a_named_cause_are_left_to_other_rules():
    assert findings(_trace(nonfinite=True), SLUG) == []  # nonfinite-grad's
    assert findings(_trace(scaled=True), SLUG) == []  # a scaled loss: the scaler rules'
