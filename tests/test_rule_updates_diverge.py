"""updates-diverge (GD142): the gradient norms measured at each step, growing several-fold per
update, over hand-written traces."""

from __future__ import annotations

import math

from graddoctor.findings import Severity
from rule_traces import builder, findings, only

SLUG = "updates-diverge"


def _trace(totals, terms=("mean",), lr=0.1):
    t = builder()
    for i, total in enumerate(totals):
        t.clear([0, 1], line=10)
        t.backward(fresh=[0, 1], line=11, loss_terms=list(terms))
        norm = None if total is None else total / math.sqrt(2)
        t.event("step_begin", 12, opt=0, closure=False, norm_pids=[0, 1],
                norms=None if norm is None else [norm, norm], nonfinite=[], lrs=[lr])
        t.step(line=12)
    return t


def test_norms_growing_several_fold_per_update_are_a_warning_with_the_lr_to_try():
    f = only(_trace([1.0, 10.0, 100.0, 1000.0, 10000.0]), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert "grows about 10x per update over updates 1-5" in f.message
    assert "lr=0.1: try 0.01" in f.fix and "reduction" not in f.fix


def test_a_summed_loss_gets_the_fix_for_its_reduction():
    f = only(_trace([1.0, 50.0, 2500.0, 125000.0], terms=("sum",)), SLUG)
    assert "reduction='sum'" in f.fix


def test_short_slow_or_broken_growth_is_silent():
    assert findings(_trace([1.0, 10.0, 100.0, 1000.0][:3]), SLUG) == []  # two updates of growth
    assert findings(_trace([1.0, 2.5, 6.0, 15.0, 40.0, 100.0]), SLUG) == []  # < 3x per update
    assert findings(_trace([1.0, 3.0, 9.0, 27.0]), SLUG) == []  # 27x in all: short of 1000x
    assert findings(_trace([1.0, 10.0, None, 1000.0, 10000.0]), SLUG) == []  # not measured
    assert findings(_trace([1.0, 10.0, 100.0, 1.0, 10.0, 100.0]), SLUG) == []  # recovers
    assert findings(_trace([0.0, 1.0, 10.0, 100.0]), SLUG) == []  # a zero-initialised layer
