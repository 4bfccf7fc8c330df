"""functional-dropout-in-eval (GD304) and loss-shape-broadcast (GD211) on hand-written traces,
and how their aside events sit in the analysis (mode timeline, turns). No torch."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules.functional_dropout_in_eval import FunctionalDropoutInEval
from graddoctor.rules.loss_shape_broadcast import LossShapeBroadcast
from graddoctor.trace import TraceBuilder


def check(rule, t):
    return list(rule().check(Analysis(t.trace)))


def update(t, line=None):
    t.backward(fresh=[0], line=line)
    t.step(0, line=None if line is None else line + 1)


def dropout(t, line, p=0.3, name="model", cls="MLP", fn="dropout", grad=False):
    return t.put(ev.dropout_default(fn=fn, p=p, cls=cls, name=name, grad=grad), line)


def loss(t, line, a=(8, 1), b=(8,), shape=(8, 8), grad=True, fn="mse_loss", reduction="mean"):
    return t.put(ev.loss_broadcast(fn=fn, input_shape=list(a), target_shape=list(b), shape=list(shape),
                                   reduction=reduction, grad=grad), line)


# -- functional-dropout-in-eval -------------------------------------------------------------
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


# -- loss-shape-broadcast -------------------------------------------------------------------
def test_column_prediction_against_vector_target_in_training():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    loss(t, 18)
    update(t, 20)
    [f] = check(LossShapeBroadcast, t)
    assert (f.location.line, f.severity, f.step) == (18, Severity.WARNING, 2)  # the step it feeds
    assert "input (8, 1) with target (8,)" in f.message and "(8, 8)" in f.message
    assert "mean of the batch's targets" in f.message
    assert f.evidence["shape"] == [8, 8] and f.evidence["grad"] is True


def test_l1_fits_the_median_and_a_metric_says_so():
    t = TraceBuilder()
    loss(t, 5, fn="l1_loss", a=(4,), b=(4, 1), shape=(4, 4))
    loss(t, 9, fn="huber_loss", grad=False, reduction="none")
    found = check(LossShapeBroadcast, t)
    assert [f.severity for f in found] == [Severity.WARNING, Severity.WARNING]
    assert "median" in found[0].message
    assert "not the per-sample error" in found[1].message and found[1].step is None
    assert "reduction='none' returns that (8, 8) tensor" in found[1].message


def test_a_pairwise_broadcast_is_only_info():
    t = TraceBuilder()
    loss(t, 7, a=(5, 1, 3), b=(4, 3), shape=(5, 4, 3), reduction="none")  # different data, kept
    loss(t, 8, a=(6, 1, 3), b=(1, 6, 3), shape=(6, 6, 3))  # x[:, None] against x[None]: same rank
    loss(t, 9, a=(6, 1), b=(1, 6), shape=(6, 6))
    loss(t, 10, a=(6, 1), b=(1, 6), shape=(6, 6), reduction="none")  # keeps the pairwise tensor: meant
    loss(t, 11, a=(6, 1), b=(6,), shape=(6, 6), reduction="none")  # misaligned all the same
    found = check(LossShapeBroadcast, t)
    assert [(f.location.line, f.severity) for f in found] == [(8, Severity.INFO), (9, Severity.INFO),
                                                             (11, Severity.WARNING)]
    assert "pairwise" in found[0].message and "(6, 1) with target (1, 6)" in found[1].message


def test_misaligned_layouts():
    from graddoctor.rules.loss_shape_broadcast import misaligned

    assert misaligned([8, 1], [8]) and misaligned([8], [8, 1]) and misaligned([4, 1, 5, 5], [4, 5, 5])
    assert misaligned([6, 1, 3], [6, 3])
    assert not misaligned([6, 1], [1, 6]) and not misaligned([5, 1, 3], [4, 3]) and not misaligned([8, 2], [8])


# -- aside events in the analysis -----------------------------------------------------------
def _module(t, mid, layer):
    bn = layer == "batchnorm"
    t.put(ev.mode_module(mid=mid, name=f"model.{mid}", cls="BatchNorm1d" if bn else "Dropout", layer=layer,
                         has_params=bn, frozen=False if bn else None, owned=True if bn else None,
                         trainable=True if bn else None, updated=False,
                         track_running_stats=True if bn else None, momentum=0.1 if bn else None,
                         p=None if bn else 0.5))


def test_an_aside_event_inside_a_forward_keeps_the_module_facts_that_follow_it():
    # as held by the mode watcher: a module's facts come after the aggregate it joins, and an
    # aside event may sit in between
    t = TraceBuilder()
    _module(t, 0, "batchnorm")
    t.put(ev.mode_forward(training=False, grad=False, inference=False, modules=[0, 1], grad_modules=[],
                          calls=3), 30)
    dropout(t, 12)
    loss(t, 31, grad=False)
    _module(t, 1, "dropout")
    t.put(ev.run_end(status="completed", steps=0))
    [forward] = Analysis(t.trace).modes.forwards
    assert forward.states[1].get("layer") == "dropout"  # resolved with the facts after the aside events


def test_aside_events_are_not_calls_of_the_loop():
    t = TraceBuilder()
    t.optimizer(0, [0])
    for _ in range(2):
        t.clear([0], line=10)
        loss(t, 11)
        dropout(t, 4, grad=True)
        t.backward(fresh=[0], line=12)
        t.step(0, line=13)
    a = Analysis(t.trace)
    labels = [item.label for turn in a.turns for item in turn.items]
    assert "loss_broadcast" not in labels and "dropout_default" not in labels
    assert labels.count("step") == 2


def test_a_gradient_enabled_pass_in_eval_mode_says_so():
    t = TraceBuilder()
    dropout(t, 15, grad=True)
    [f] = check(FunctionalDropoutInEval, t)
    assert "gradient-enabled pass" in f.message and f.evidence["grad"] is True
