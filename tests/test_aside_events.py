"""Aside events (a functional dropout call, a regression loss's shapes: ``events.ASIDE_KINDS``) in
the analysis: they keep the mode timeline's module facts and are no calls of the loop. No torch."""

from __future__ import annotations

from aside_traces import dropout, loss
from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.trace import TraceBuilder


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
