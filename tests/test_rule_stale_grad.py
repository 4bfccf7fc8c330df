"""stale-grad (GD103) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.trace import TraceBuilder
from rule_traces import slugs


def test_stale_grad_points_at_the_step():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    t.backward(fresh=[0, 1], line=6)
    t.step(0, line=7)
    t.clear([0], opt=None, line=5)
    t.backward(fresh=[0], line=6)  # param 1 gets nothing new but keeps its old grad
    t.step(0, line=7)
    assert slugs(t.trace) == [("stale-grad", 7)]
