"""functional-dropout-in-eval (GD304) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from aside_traces import check, dropout, update
from graddoctor.findings import Severity
from graddoctor.rules.functional_dropout_in_eval import FunctionalDropoutInEval
from graddoctor.trace import TraceBuilder


def test_dropout_default_in_eval_is_reported_at_the_call():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    t.event("eval", 30, mode=False, leaf=False, root="MLP", frozen=False, modules=[], calls=1)
    dropout(t, 15)
    [f] = check(FunctionalDropoutInEval, t)
    assert (f.location.line, f.severity, f.step) == (15, Severity.WARNING, 1)
    assert "F.dropout" in f.message and "30%" in f.message and "model (MLP) is in eval mode" in f.message
    assert f.evidence == {"function": "dropout", "p": 0.3, "module": "model", "class": "MLP", "grad": False}


def test_dropout_without_a_name_names_the_class_and_each_line_once():
    t = TraceBuilder()
    dropout(t, 15, name=None, cls="Block", fn="dropout2d", p=0.1)
    dropout(t, 40, name="net.head", cls="Head")
    found = check(FunctionalDropoutInEval, t)
    assert [f.location.line for f in found] == [15, 40]
    assert "F.dropout2d" in found[0].message and "although Block is in eval mode" in found[0].message
    assert found[0].step is None  # before any step


def test_no_dropout_event_no_finding():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    assert check(FunctionalDropoutInEval, t) == []


def test_a_gradient_enabled_pass_in_eval_mode_says_so():
    t = TraceBuilder()
    dropout(t, 15, grad=True)
    [f] = check(FunctionalDropoutInEval, t)
    assert "gradient-enabled pass" in f.message and f.evidence["grad"] is True
