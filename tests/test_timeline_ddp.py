"""The update timeline of a DDP loop: backwards under ``no_sync()`` and all-reducing ones are told
apart. No torch."""

from __future__ import annotations

from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.report.timeline import shapes
from graddoctor.trace import TraceBuilder
from rule_traces import ddp_window


def test_the_timeline_shows_no_sync_and_all_reduces():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(2):
        ddp_window(t, [False, True])
    a = Analysis(t.trace)
    analyze(a)
    labels = [item.label for item in shapes(a)[0].items]
    assert labels == ["no_sync", "backward (no_sync)", "backward + all-reduce", "step", "zero_grad"]
