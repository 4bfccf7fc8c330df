"""One root cause, one finding: where a bug could be read as two rules' patterns, only the rule
that names its cause reports it (hand-written traces, no torch)."""

from __future__ import annotations

from rule_traces import P, builder, findings


def test_one_root_cause_one_finding_misplaced_clear_is_not_also_never_accumulates():
    """zero_grad before every micro-batch leaves one backward per step: that is misplaced-zero-grad's
    finding, not a counter that never advances."""
    t = builder()
    for i in range(12):
        t.clear(P, opt=0, line=13)
        t.backward(fresh=P, line=15, loss_scale_factor=0.25, loss_terms=["mean"])
        if (i + 1) % 4 == 0:
            t.step(0, line=17)
    assert findings(t, "accumulation-never-accumulates") == []
    assert [f.location.line for f in findings(t, "misplaced-zero-grad")] == [13]
