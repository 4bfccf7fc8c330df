"""param-replaced (GD119) on hand-written traces: a parameter an optimizer owns replaced in its
module while that optimizer still steps, and the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "param-replaced"


def replaced(new_owned=False, rebuilt=False, via="parameter"):
    t = TraceBuilder()
    t.param(0, "fc.weight")
    t.param(1, "fc.bias")
    t.optimizer(0, [0, 1], line=3)
    t.put(ev.param_replaced(owner="Linear", attr="weight", via=via, old=[0], new=[2]), 5)
    t.param(2, "fc.weight")
    if new_owned:
        t.optimizer(0, [2], line=6)
    if rebuilt:
        t.optimizer(1, [2, 1], line=6)
    for _ in range(3):
        t.clear([0, 1, 2], opt=1 if rebuilt else 0, line=8)
        t.backward(fresh=[1, 2], line=9)
        t.step(1 if rebuilt else 0, line=10, without_grad=[] if rebuilt else [0])
    return t


def test_a_new_parameter_no_optimizer_owns_is_a_warning_at_the_replacing_line():
    f = only(replaced(), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 5
    assert "fc.weight" in f.message and "never train" in f.message
    assert [r.location.line for r in f.related] == [3, 9]


def test_the_symptoms_are_left_to_it():
    t = replaced()
    assert findings(t, "param-not-in-optimizer") == [] and findings(t, "param-without-grad") == []


def test_a_submodule_replaced_names_the_attribute_in_the_fix():
    f = only(replaced(via="module"), SLUG)
    assert ".weight" in f.fix and "add_param_group" in f.fix


def test_a_tied_weight_the_optimizer_owns_too_is_info():
    t = TraceBuilder()
    t.param(0, "emb.weight")
    t.param(1, "out.weight")
    t.optimizer(0, [0, 1], line=3)
    t.put(ev.param_replaced(owner="Linear", attr="weight", via="parameter", old=[1], new=[0]), 5)
    for _ in range(3):
        t.backward(fresh=[0], line=9)
        t.step(0, line=10, without_grad=[1])
    f = only(t, SLUG)
    assert f.severity == Severity.INFO and "tied" in f.message


def test_an_optimizer_rebuilt_over_the_new_parameters_is_silent():
    assert findings(replaced(rebuilt=True), SLUG) == []


def test_a_replacement_after_the_last_step_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    t.backward(fresh=[0], line=9)
    t.step(0, line=10)
    t.put(ev.param_replaced(owner="Linear", attr="weight", via="parameter", old=[0], new=[1]), 12)
    assert findings(t, SLUG) == []


def test_a_reset_every_epoch_is_one_finding_at_its_line():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for epoch in range(3):
        t.put(ev.param_replaced(owner="Head", attr="scale", via="parameter",
                                old=[epoch], new=[epoch + 1]), 5)
        t.backward(fresh=[epoch + 1], line=9)
        t.step(0, line=10, without_grad=[0])
    f = only(t, SLUG)
    assert f.location.line == 5
    assert findings(t, "param-not-in-optimizer") == []
