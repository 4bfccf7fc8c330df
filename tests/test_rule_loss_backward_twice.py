"""loss-backward-twice (GD118): hand-written traces, and the mark a retained backward leaves on
its loss node."""

from __future__ import annotations

import torch

from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, clip, findings, only

SLUG = "loss-backward-twice"


def _run(between=None, cls="SGD", clipped=False, second_writes=P):
    t = builder(cls=cls)
    for _ in range(2):
        t.clear(P, line=10)
        first = t.backward(fresh=P, line=11)
        if between == "step":
            t.step(line=12)
        elif between == "clear":
            t.clear(P, line=12)
        t.backward(accumulated=list(second_writes), line=13, repeats=first.seq)
        if clipped:
            clip(t, line=14)
        t.step(line=15)
    return t


def test_the_same_loss_twice_before_the_step_is_a_warning_at_the_second_backward():
    f = only(_run(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 13
    assert "line 11" in f.message and "twice the gradient" in f.message
    assert f.evidence["occurrences"] == 2


def test_adam_without_clipping_is_info_with_clipping_a_warning():
    assert only(_run(cls="AdamW"), SLUG).severity is Severity.INFO
    assert only(_run(cls="AdamW", clipped=True), SLUG).severity is Severity.WARNING


def test_silent_after_a_step_or_a_clear_and_for_other_parameters():
    assert findings(_run(between="step"), SLUG) == []
    assert findings(_run(between="clear"), SLUG) == []
    assert findings(_run(second_writes=[]), SLUG) == []


def test_a_retained_backward_marks_its_loss_and_only_that_loss_repeats():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        w = torch.nn.Parameter(torch.ones(3))
        loss, other = (w * 2).sum(), (w * 3).sum()
        loss.backward(retain_graph=True)
        other.backward()
        loss.backward()
    repeats = [e.get("repeats") for e in rec.trace.of_kind("backward")]
    first = rec.trace.of_kind("backward")[0].seq
    assert repeats == [None, None, first]
