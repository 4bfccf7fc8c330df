"""module-method-shadowed (GD179): on hand-written traces (no torch), and the
``nn.Module.__setattr__`` watcher in-process for ``train``/``eval``: what it records (the
BatchNorm/dropout layers as the mode watcher numbers them), what it leaves alone, and the fix."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, fold_hard, only

SLUG = "module-method-shadowed"


def shadow(t, name="eval", value=True, layers=(7,), mid=0, line=4):
    return t.put(ev.module_attr(mid=mid, cls="Sequential", name=name, value=value, params=[],
                                layers=list(layers)), line)


def layer(t, mid=7, kind="dropout"):
    t.put(ev.mode_module(mid=mid, name=f"model.{mid}", cls="Dropout", layer=kind,
                         has_params=False, frozen=None, owned=None, trainable=None,
                         updated=False, track_running_stats=None, momentum=None, p=0.5))


def forward(t, training, modules=(7,), line=9):
    t.put(ev.mode_forward(training=training, grad=False, inference=False,
                          modules=list(modules), grad_modules=[]), line)


def test_eval_assigned_then_a_forward_in_train_mode_is_a_warning_at_the_assignment():
    t = TraceBuilder()
    layer(t)
    shadow(t)
    forward(t, training=True)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert "over the Sequential's eval() method" in f.message and "dropout on" in f.message
    assert "forward at line 9" in f.message and f.related[0].location.line == 9
    assert f.fix.startswith("call model.eval()") and f.evidence["meant"] == "eval"


def test_train_false_means_eval_and_train_true_means_train():
    t = TraceBuilder()
    layer(t)
    shadow(t, name="train", value=False)
    forward(t, training=True)
    assert only(t, SLUG).evidence["meant"] == "eval"
    t = TraceBuilder()
    layer(t, kind="batchnorm")
    shadow(t, name="train", value=True)
    forward(t, training=False)
    f = only(t, SLUG)
    assert f.evidence["meant"] == "train" and "running statistics that stop adapting" in f.message


def test_forwards_in_the_meant_mode_or_of_other_layers_are_silent():
    t = TraceBuilder()
    layer(t)
    shadow(t, name="train", value=True)  # a module's own option, and it trains
    forward(t, training=True)
    shadow(t, mid=1, layers=(8,), line=6)  # eval shadowed on a module no forward runs after
    forward(t, training=True, modules=(7,), line=10)
    assert findings(t, SLUG) == []


def test_a_module_without_dropout_or_batchnorm_and_a_value_that_is_no_mode_are_silent():
    t = TraceBuilder()
    shadow(t, layers=())
    shadow(t, value="yes", line=5)
    forward(t, training=True)
    assert findings(t, SLUG) == []


def test_the_same_modules_other_assignments_are_named_in_the_fix():
    t = TraceBuilder()
    layer(t)
    shadow(t, name="train", value=True, line=3)
    shadow(t, line=4)
    forward(t, training=True)
    f = only(t, SLUG)
    assert f.location.line == 4 and "assignment at line 3 must become a call too" in f.fix
    assert f.evidence["other_lines"] == [3]


def test_the_finding_survives_folding():
    t = TraceBuilder()
    layer(t)
    t.optimizer(0, [0], line=2)
    shadow(t)
    for _ in range(12):
        forward(t, training=True)
        t.backward(fresh=[0], line=10)
        t.step(0, line=11)
    assert only(fold_hard(t.trace), SLUG).location.line == 4


def record(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        fn()
    return rec.trace


def test_the_watcher_names_the_layers_as_the_mode_watcher_does_and_skips_callables():
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    plain = nn.Linear(3, 3)
    seen = {}

    def script():
        model.eval = True
        plain.train = False
        model[0].eval = lambda: None  # a method replaced on purpose
        seen.update(eval=model.eval, training=model.training)
        model[1].train(False)  # the layers' own methods still work

    trace = record(script)
    assert seen == {"eval": True, "training": True}
    shadowed = [e for e in trace if e.kind == "module_attr"]
    assert [(e["name"], e["value"], len(e["layers"])) for e in shadowed] == [
        ("eval", True, 2), ("train", False, 0)]
    eval_event = next(e for e in trace if e.kind == "eval")
    assert eval_event["modules"][0] in shadowed[0]["layers"]
