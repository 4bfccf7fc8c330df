"""partial-zero-grad (GD102) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.trace import TraceBuilder
from rule_traces import slugs


def test_partial_zero_grad_points_at_the_clear():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    t.backward(fresh=[0, 1], line=6)
    t.step(0, line=7)
    for _ in range(2):
        t.clear([0], opt=None, line=5)  # model_a.zero_grad(): param 1 is skipped
        t.backward(fresh=[0], accumulated=[1], line=6)
        t.step(0, line=7)
    assert slugs(t.trace) == [("partial-zero-grad", 5)]
