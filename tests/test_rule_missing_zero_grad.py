"""missing-zero-grad (GD101) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.trace import TraceBuilder
from rule_traces import basic, lbfgs_loop, slugs


def test_missing_zero_grad_points_at_backward():
    trace = basic(TraceBuilder(), with_clear=False)
    assert slugs(trace) == [("missing-zero-grad", 6)]
    led = Analysis(trace).ledger
    assert {u.pid for u in led.old_uses} == {0, 1}
    assert led.old_uses[0].step_index == 2


def test_a_closure_that_never_clears_is_caught_on_a_single_step():
    trace = lbfgs_loop(TraceBuilder(), clear_inside=False)
    assert slugs(trace) == [("missing-zero-grad", 16)]
    (finding,) = [f for f in analyze(trace)[0] if f.rule == "missing-zero-grad"]
    assert "closure" in finding.message and "closure" in finding.fix
    assert [r.location.line for r in finding.related] == [21]  # not its own line again


def test_a_window_holds_only_gradients_applied_for_the_first_time():
    """Missing zero_grad in an accumulation loop: each step re-applies every earlier gradient,
    but its accumulation window is still the k backwards it applies for the first time (the
    re-application is missing-zero-grad's finding, not a window of growing k)."""
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for i in range(12):
        if i == 0:
            t.backward(fresh=[0, 1], line=14)
        else:
            t.backward(accumulated=[0, 1], line=14)
        if (i + 1) % 4 == 0:
            t.step(0, line=16)
    (windows,) = Analysis(t.trace).windows.values()
    assert [w.k for w in windows] == [4, 4, 4]
    assert slugs(t.trace) == [("missing-zero-grad", 14)]


def test_a_backward_that_leaks_into_cleared_grads_is_named_as_the_source():
    """D is cleared every iteration, but the generator's backward (through an undetached D)
    writes D's grads after that clear: the finding names that backward, not 'never cleared'."""
    t = TraceBuilder()
    t.optimizer(0, [0], line=8)  # G
    t.optimizer(1, [1], line=9)  # D
    for i in range(3):
        t.clear([1], opt=1, line=12)
        t.clear([0], opt=0, line=13)
        t.backward(fresh=[0, 1], line=15)  # generator loss through D
        t.step(0, line=16)
        t.backward(accumulated=[1], line=18)  # D's own loss
        t.step(1, line=19)
    (finding,) = [f for f in analyze(t.trace)[0] if f.rule == "missing-zero-grad"]
    assert finding.location.line == 18
    assert "are cleared (line 12)" in finding.message and "backward at line 15" in finding.message
    assert [(r.location.line, r.note) for r in finding.related][0] == (
        15, "the backward whose gradients leak into this step")


def test_a_leak_after_a_clear_at_the_end_of_the_iteration_is_named_from_the_second_update():
    """G cleared right after its step: on the first update nothing was cleared yet, but from
    the second on D's backward writes G's grads after G's clear. The finding names the leak (no
    'never cleared', no zero_grad autofix at the top of the loop), not the first update."""
    t = TraceBuilder()
    t.optimizer(0, [0], line=8)  # G
    t.optimizer(1, [1], line=9)  # D
    for i in range(3):
        t.clear([1], opt=1, line=12)
        t.backward(fresh=[0, 1], line=14)  # D's loss through G's undetached output
        t.step(1, line=15)
        t.backward(accumulated=[0], line=17)  # G's own loss
        t.step(0, line=18)
        t.clear([0], opt=0, line=19)
    (finding,) = [f for f in analyze(t.trace)[0] if f.rule == "missing-zero-grad"]
    assert finding.location.line == 17
    assert "are cleared (line 19)" in finding.message and "backward at line 14" in finding.message
    assert "never cleared" not in finding.message


def test_an_optimizer_stepping_after_another_one_stepped_on_the_same_backward_is_no_leak():
    """A shared trunk (param 0) with one optimizer per head (params 1, 2): each head's loss is
    backpropagated and its head stepped, then the trunk's optimizer steps over both losses'
    gradients. Another optimizer steps between the second backward and the trunk's step: meant."""
    t = TraceBuilder()
    t.optimizer(0, [0], line=5)  # trunk
    t.optimizer(1, [1], line=6)  # head 1
    t.optimizer(2, [2], line=7)  # head 2
    for i in range(3):
        t.clear([0], opt=0, line=10)
        t.clear([1], opt=1, line=10)
        t.clear([2], opt=2, line=10)
        t.backward(fresh=[0, 1], line=12)
        t.step(1, line=13)
        t.backward(accumulated=[0], fresh=[2], line=14)
        t.step(2, line=15)
        t.step(0, line=16)
    assert "missing-zero-grad" not in [slug for slug, _ in slugs(t.trace)]
    # the same loop with the trunk stepped right after the second backward reads as a leak
    t = TraceBuilder()
    t.optimizer(0, [0], line=5)
    t.optimizer(1, [1], line=6)
    t.optimizer(2, [2], line=7)
    for i in range(3):
        t.clear([0], opt=0, line=10)
        t.clear([1], opt=1, line=10)
        t.clear([2], opt=2, line=10)
        t.backward(fresh=[0, 1], line=12)
        t.step(1, line=13)
        t.backward(accumulated=[0], fresh=[2], line=14)
        t.step(0, line=15)
        t.step(2, line=16)
    assert ("missing-zero-grad", 14) in slugs(t.trace)

def test_under_ddp_a_clear_on_some_ranks_only_says_what_every_rank_applies():
    """DDP averages the ranks' gradients: where rank 0 alone clears, every rank applies the
    fresh average plus (N-1)/N of the previous gradient, not "the sum of all gradients"."""
    from graddoctor.findings import Finding, Severity
    from graddoctor.report.merge import Part, merge
    from graddoctor.report.model import Report, RunInfo
    from graddoctor.rules import ALL_RULES
    from graddoctor.trace import Location

    def part(rank, findings):
        run = RunInfo(script="train.py", argv=[], status="step-limit", steps=4)
        return Part(Report(run=run, findings=findings), rank, f"rank {rank}")

    def gd101(allreduce):
        return Finding("missing-zero-grad", "GD101", Severity.ERROR,
                       "every optimizer step applies the sum of all gradients so far",
                       Location("train.py", 10), evidence={"params": ["w"], **(
                           {"allreduce": True} if allreduce else {})})

    merged = merge([part(0, []), part(1, [gd101(True)]), part(2, [gd101(True)])], world_size=3,
                   rules=ALL_RULES)
    [f] = merged.findings
    assert f.ranks == (1, 2) and "only rank 0 clears" in f.message
    assert "fresh averaged gradient plus 2/3 of the previous update's gradient" in f.message
    assert f.fix.startswith("clear the gradients on every rank, not under a rank test")
    again = merge([Part(merged, None, "merged")], world_size=3, rules=ALL_RULES)
    assert again.findings[0].message == f.message  # said once, not rewritten again
    plain = merge([part(0, []), part(1, [gd101(False)])], world_size=2, rules=ALL_RULES)
    assert "sum of all gradients" in plain.findings[0].message  # no all-reduce: as it was


def _accumulation_with_a_probe(model_clears: bool, windows: int = 4):
    """The model (optimizer 0, params 0-1) accumulates two micro-batches per step at line 10;
    a probe (optimizer 1, param 2) is cleared and stepped after every micro-batch."""
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1)
    t.optimizer(1, [2], line=2)
    cleared = True
    for _ in range(windows):
        for i in range(2):
            t.backward(fresh=[0, 1] if cleared else (), accumulated=() if cleared else [0, 1], line=10)
            cleared = False
            if i == 1:
                t.step(0, line=11)
                if model_clears:
                    t.clear([0, 1], line=12)
                    cleared = True
            t.clear([2], line=13)
            t.backward(fresh=[2], line=14)
            t.step(1, line=15)
    return t.trace


def test_a_probe_stepped_inside_the_accumulation_window_is_no_missing_zero_grad():
    assert slugs(_accumulation_with_a_probe(model_clears=True)) == []
    # the same loop without the model's clear: each model step applies the old windows again
    assert ("missing-zero-grad", 10) in slugs(_accumulation_with_a_probe(model_clears=False))


def test_another_optimizers_leftover_hit_by_a_loop_that_clears_after_its_steps_is_named_so():
    """Source training (opt 0, cleared before each backward) leaves its last gradient; the next
    phase's optimizer (opt 1, over some of the same parameters) clears only after its steps:
    its first step alone applies the leftover, and the message says so, not 'never cleared'."""
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=8)
    for i in range(3):
        t.clear([0, 1], opt=0, line=10)
        t.backward(fresh=[0, 1], line=11)
        t.step(0, line=12)
    t.optimizer(1, [1], line=14)
    t.backward(accumulated=[1], line=16)
    t.step(1, line=17)
    t.clear([1], opt=1, line=18)
    for i in range(2):
        t.backward(fresh=[1], line=16)
        t.step(1, line=17)
        t.clear([1], opt=1, line=18)
    (finding,) = [f for f in analyze(t.trace)[0] if f.rule == "missing-zero-grad"]
    assert finding.location.line == 16
    assert "clears them only after its own steps" in finding.message
    assert "never cleared" not in finding.message
