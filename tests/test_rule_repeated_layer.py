"""repeated-layer (GD129): one module object at several positions of a ModuleList/Sequential,
on hand-written traces (the rule) and on small models built under the instrumentation (the
registration hook that records it)."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "repeated-layer"


def trace(positions=("0", "1", "2", "3"), stepped=True, written=True, extra=()):
    t = TraceBuilder()
    t.param(0, "model.layers.0.weight")
    t.param(1, "model.layers.0.bias")
    t.param(2, "model.head.weight")
    for k in range(1, len(positions)):
        t.put(ev.module_repeated(container="ModuleList", cls="Linear",
                                 positions=list(positions[:k + 1]), params=[0, 1]), 7)
    for e in extra:
        t.put(e, 7)
    t.optimizer(0, [0, 1, 2], line=12)
    for _ in range(3):
        t.clear([0, 1, 2], line=15)
        t.backward(fresh=[0, 1, 2] if written else [2], line=16)
        if stepped:
            t.step(0, line=17)
    return t


def test_a_repeated_layer_that_trains_is_a_warning_at_the_container_with_every_position():
    f = only(trace(), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 7
    assert "4 positions (0, 1, 2, 3)" in f.message and "Linear" in f.message
    assert "model.layers.0.weight" in f.message
    assert f.evidence["positions"] == 4
    assert [r.location.line for r in f.related] == [16]


def test_silent_when_the_repeated_layer_never_trains():
    assert findings(trace(stepped=False), SLUG) == []
    assert findings(trace(written=False), SLUG) == []  # frozen: no backward writes it


def test_a_second_repeated_module_of_the_same_line_is_counted_not_reported_twice():
    norm = ev.module_repeated(container="ModuleList", cls="LayerNorm", positions=["0", "1"],
                              params=[2])
    f = only(trace(extra=[norm]), SLUG)
    assert "4 positions" in f.message and "1 more repeated module" in f.message


def _events_of(build):
    """The module_repeated events recorded while ``build()`` makes models under the
    instrumentation (no script run)."""
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        build()
    return [e for e in rec.trace if e.kind == "module_repeated"]


def test_the_hook_records_a_repeat_in_a_list_and_a_sequential_built_here():
    layer = nn.Linear(4, 4)
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    found = _events_of(lambda: (nn.ModuleList([layer] * 3),
                                nn.Sequential(nn.Linear(2, 4), *[block] * 2)))
    assert [(e["container"], e["cls"], e["positions"]) for e in found] == [
        ("ModuleList", "Linear", ["0", "1"]), ("ModuleList", "Linear", ["0", "1", "2"]),
        ("Sequential", "Sequential", ["1", "2"])]
    assert all(e.loc is not None and e.loc.path.endswith("test_rule_repeated_layer.py") for e in found)


def test_the_hook_ignores_parameter_free_modules_distinct_layers_and_reassignment():
    act = nn.ReLU()

    def build():
        nn.Sequential(nn.Linear(4, 4), act, nn.Linear(4, 4), act)
        layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        layers[1] = layers[1]  # the same module at its own position
        nn.ModuleDict({"a": act, "b": act})

    assert _events_of(build) == []


def test_the_hook_records_a_layer_assigned_again_at_another_index():
    layer = nn.Linear(4, 4)

    def build():
        layers = nn.ModuleList([layer, nn.Linear(4, 4)])
        layers[1] = layer  # ModuleList.__setitem__ goes through Module.__setattr__ (wrapped)

    [found] = _events_of(build)
    assert found["positions"] == ["0", "1"]
