"""grads-cleared-before-step (GD122): hand-written traces, and the clearing statement read from
the script's source (analysis/source.py, ``grad_clears``)."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.source import grad_clears
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "grads-cleared-before-step"

SCRIPT = """\
for step in range(10):
    loss.backward()
    for p in params:
        p.grad = None
    optimizer.step()
"""


def _loop(path="train.py", how="none", cleared=P, steps=3, spared_step=None) -> TraceBuilder:
    t = TraceBuilder(path)
    t.optimizer(0, P, line=1, cls="SGD")
    for i in range(steps):
        t.backward(fresh=P, line=2)
        this = [] if i == spared_step else list(cleared)
        if how == "zero" and this:
            t.event("grad_edit", 5, opt=0, params=this)
        norms = [0.0 if p in this else 1.0 for p in P] if how == "zero" else [1.0] * len(P)
        t.event("step_begin", 5, opt=0, closure=False, norm_pids=P, norms=norms, nonfinite=[],
                frozen=None, edited_params=[], moved=[], lrs=[0.1])
        t.step(line=5, without_grad=this if how == "none" else [])
    return t


def test_every_step_finding_its_gradients_none_is_an_error_at_the_clearing_statement(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    f = only(_loop(str(path)), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 4
    assert "`p.grad = None`" in f.message and "None" in f.message
    assert f.fix.startswith("move `p.grad = None` after optimizer.step()")


def test_without_the_source_it_points_at_the_step_and_zeroed_grads_count_with_their_edit():
    f = only(_loop(how="zero"), SLUG)
    assert f.location.line == 5 and f.evidence["cleared_to"] == "zero"


def test_silent_on_a_frozen_part_an_occasional_drop_and_a_single_step():
    assert findings(_loop(cleared=[0]), SLUG) == []
    assert findings(_loop(spared_step=1), SLUG) == []
    assert findings(_loop(steps=1), SLUG) == []


def test_grad_clears_reads_the_hand_written_clears_between_two_lines(tmp_path):
    path = tmp_path / "loop.py"
    path.write_text(textwrap.dedent("""\
        loss.backward()
        p.grad = None
        p.grad.zero_()
        p.grad.data.zero_()
        p.grad.fill_(0)
        p.grad.mul_(0.5)
        p.grad *= 0
        p.grad = torch.zeros_like(p)
        optimizer.step()
        """))
    assert [line for line, _ in grad_clears(str(path), 2, 8)] == [2, 3, 4, 5, 7]
    assert grad_clears(str(path), 9, 9) == []
