"""param-not-in-optimizer (GD105) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.rules.engine import analyze
from graddoctor.trace import TraceBuilder


def test_no_optimizer_gives_one_info():
    t = TraceBuilder()
    for _ in range(3):
        t.backward(fresh=[0], line=6)
    findings, _ = analyze(t.trace)
    assert [(f.rule, f.severity.value) for f in findings] == [("param-not-in-optimizer", "info")]
