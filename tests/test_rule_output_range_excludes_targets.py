"""output-range-excludes-targets (GD228): what bounds a prediction (instrument/losses.py
``bounded_by``), the regression-loss watcher's output_range events, and the rule."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.losses import bounded_by
from rule_traces import builder, findings, only

SLUG = "output-range-excludes-targets"
X = torch.randn(8, 3, requires_grad=True)


@pytest.mark.parametrize("make, bound", [
    (lambda: torch.sigmoid(X), ("sigmoid", 0.0, 1.0)),
    (lambda: torch.tanh(X).reshape(-1)[:5], ("tanh", -1.0, 1.0)),
    (lambda: F.relu(X).squeeze(), ("relu", 0.0, math.inf)),
    (lambda: torch.cat([torch.sigmoid(X), torch.sigmoid(X * 2)], 1), ("sigmoid", 0.0, 1.0)),
    (lambda: F.softmax(X, 1), ("softmax", 0.0, 1.0)),
    (lambda: X.exp(), ("exp", 0.0, math.inf)),
    (lambda: X * 2, None),
    (lambda: 255 * torch.sigmoid(X), None),  # scaled after the activation
    (lambda: torch.sigmoid(X).clamp(0.1, 0.9), None),  # clamped: a range of its own
    (lambda: torch.cat([torch.sigmoid(X), torch.tanh(X)], 1), None),  # parts disagree
])
def test_bounded_by(make, bound):
    assert bounded_by(make().grad_fn) == bound


def _events(calls):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for prediction, target in calls:
            F.mse_loss(prediction(), target).backward()
    return [e for e in rec.trace if e.kind == "output_range"]


def test_targets_outside_the_activations_range_are_recorded_once_per_line():
    found = _events([(lambda: torch.sigmoid(X), torch.full((8, 3), 50.0))] * 3)
    assert [(e["fn"], e["activation"], e["outside"]) for e in found] == [("mse_loss", "sigmoid", 1.0)]
    assert found[0]["high"] == 1.0 and found[0]["target_low"] == 50.0


def test_targets_inside_the_range_or_few_outliers_are_not():
    inside = torch.rand(8, 3)
    few = inside.clone()
    few[0, 0] = 5.0  # one outlier of 24
    assert _events([(lambda: torch.sigmoid(X), inside), (lambda: torch.sigmoid(X), few),
                    (lambda: X * 3, torch.full((8, 3), 50.0))]) == []


def _trace(**kw):
    t = builder()
    data = dict(fn="mse_loss", activation="sigmoid", low=0.0, high=1.0, outside=1.0,
                target_low=20.0, target_high=80.0)
    data.update(kw)
    t.put(ev.output_range(**data), 11)
    return t


def test_the_finding_names_the_activation_and_the_targets():
    f = only(_trace(), SLUG)
    assert f.location.line == 11 and "sigmoid (always in (0, 1))" in f.message
    assert "from 20 to 80" in f.message and "100%" in f.message
    f = only(_trace(activation="relu", high=None, outside=0.4, target_low=-2.5, target_high=2.2), SLUG)
    assert "[0, inf)" in f.message and "passes no gradient" in f.message


def test_no_event_no_finding():
    assert findings(builder(), SLUG) == []


def _relocated(tmp_path, monkeypatch, source: str, activation: str, line: int):
    from graddoctor.rules.engine import analyze
    from rule_traces import builder
    (tmp_path / "train.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.event("output_range", line, fn="mse_loss", activation=activation, low=0.0, high=None,
            outside=0.5, target_low=-2.0, target_high=2.0)
    [finding] = [f for f in analyze(t.trace)[0] if f.rule == "output-range-excludes-targets"]
    return finding


def test_a_final_relu_of_the_model_is_the_line_shown_with_the_loss_related(tmp_path, monkeypatch):
    src = ("import torch\n"
           "model = nn.Sequential(\n"
           "    nn.Linear(4, 1),\n"
           "    nn.ReLU(),\n"
           ")\n"
           "loss = F.mse_loss(model(x), y)\n")
    finding = _relocated(tmp_path, monkeypatch, src, "relu", 6)
    assert finding.location.line == 4 and [r.location.line for r in finding.related] == [6]


def test_a_sigmoid_or_a_relu_at_the_loss_call_keeps_the_loss_line(tmp_path, monkeypatch):
    # a sigmoid's targets may be the thing to scale: the loss line stays
    src = "import torch\nmodel = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = F.mse_loss(model(x), y)\n"
    assert _relocated(tmp_path, monkeypatch, src, "sigmoid", 3).location.line == 3
    src = ("import torch\nmodel = nn.Sequential(nn.Linear(4, 1), nn.ReLU())\n"
           "loss = F.mse_loss(F.relu(model(x)), y)\n")
    assert _relocated(tmp_path, monkeypatch, src, "relu", 3).location.line == 3
