"""unscaled-accumulation and micro-batches weighted by their share of the window."""

from __future__ import annotations

from graddoctor.rules.engine import analyze
from graddoctor.trace import TraceBuilder


def findings(trace) -> list[tuple[str, str, int]]:
    found, errors = analyze(trace)
    assert not errors
    return sorted((f.rule, f.severity.value, f.location.line) for f in found)


def windows(factor_rows) -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for row in factor_rows:
        for j, f in enumerate(row):
            t.backward(fresh=[0] if j == 0 else [], accumulated=[] if j == 0 else [0],
                       loss_scale_factor=f, line=15)
        t.step(0, line=16)
        t.clear([0], line=17)
    return t.trace


def test_factors_adding_up_to_one_are_a_weighted_mean():
    rows = [(8 / 20, 5 / 20, 7 / 20), (4 / 18, 8 / 18, 6 / 18), (3 / 19, 8 / 19, 8 / 19)]
    assert findings(windows(rows)) == []


def test_factors_adding_up_to_a_half_are_a_weighted_mean_per_sample():
    rows = [(0.2, 0.1, 0.2), (0.25, 0.125, 0.125)]
    assert findings(windows(rows)) == []


def test_factors_adding_up_to_more_than_one_stay_odd():
    rows = [(0.4, 0.5, 0.3), (0.6, 0.3, 0.3)]
    assert findings(windows(rows)) == [("unscaled-accumulation", "info", 15)]


def test_undivided_window_still_warns():
    rows = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0)]
    assert [f[0] for f in findings(windows(rows))] == ["unscaled-accumulation"]
