"""step-without-allreduce (GD401) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.trace import TraceBuilder
from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from rule_traces import ddp_window, findings, fold_hard


def test_every_micro_batch_under_no_sync_is_flagged_at_the_step():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        ddp_window(t, [False, False])
    found = findings(t, "step-without-allreduce")
    assert [(f.location.line, f.step, f.evidence["updates"]) for f in found] == [(20, 1, 3)]
    assert [r.location.line for r in found[0].related] == [10, 12]


def test_the_last_micro_batch_synchronised_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        ddp_window(t, [False, False, True])
    assert findings(t, "step-without-allreduce") == []


def test_no_ddp_no_finding_and_a_single_sync_before_the_last_micro_batch_is_enough():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    t.backward(fresh=[0, 1], line=12)  # a plain backward: no allreduce key
    t.step(0, line=20)
    ddp_window(t, [False, True, False, True])  # the last backward syncs all accumulated so far
    assert findings(t, "step-without-allreduce") == []


def test_a_sync_followed_by_no_sync_micro_batches_is_flagged_at_the_no_sync():
    # `model.no_sync() if last else nullcontext()`: the window's last micro-batch is the one
    # no_sync() covers; what it adds after the synchronised backward stays each rank's own
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        ddp_window(t, [True, True, False])
    [f] = findings(t, "step-without-allreduce")
    assert (f.location.line, f.step) == (10, 1)
    assert f.evidence == {"backwards": 3, "unsynchronised": 1, "updates": 3, "partial": True}
    assert "the last 1 micro-batch before this optimizer step ran under model.no_sync()" in f.message
    assert [r.location.line for r in f.related] == [12, 20]
    assert "no_sync() for every micro-batch but the last" in f.fix


def test_a_trailing_no_sync_window_all_reduced_by_hand_is_silent():
    from graddoctor import events as ev
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        t.backward(fresh=[0, 1], line=12, allreduce=True)
        t.put(ev.ddp_no_sync(ddp=0), 10)
        t.backward(fresh=[0, 1], line=12, allreduce=False)
        t.put(ev.grad_allreduce(opt=0, op="avg", world=2, params=2, via="grad", scale=1.0,
                                before=False), 14)
        t.step(0, line=20)
    assert findings(t, "step-without-allreduce") == []


def test_another_optimizers_parameters_do_not_count():
    t = TraceBuilder()
    t.optimizer(0, [0])
    t.optimizer(1, [1])
    t.backward(fresh=[1], line=12, allreduce=False)  # opt 1's module is the no_sync one
    t.backward(fresh=[0], line=13, allreduce=True)
    t.step(0, line=20)
    t.step(1, line=21)
    found = findings(t, "step-without-allreduce")
    assert [f.location.line for f in found] == [21]


def test_updates_folded_out_of_a_long_run_are_counted():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(8):
        ddp_window(t, [False, False])
    folded = Analysis(fold_hard(t.trace))
    assert folded.of_kind("folded")
    [finding] = find_rule("step-without-allreduce")().check(folded)
    assert finding.evidence["updates"] == 8 and "(8 updates like this" in finding.message
