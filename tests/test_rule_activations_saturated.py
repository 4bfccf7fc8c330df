"""activations-saturated (GD177): hand-written traces of activation_saturated events, and the
watcher that measures tanh/sigmoid inputs at the first steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, fold_hard

SLUG = "activations-saturated"


def _trace(saturated=(), pixels=False):
    t = TraceBuilder()
    t.optimizer(0, P, line=3)
    for i in range(3):
        t.clear(P, line=10)
        if i == 0 and pixels:
            t.put(ev.pixels_unscaled(module="Conv2d", shape=[2, 1, 4, 4], low=0, high=255,
                                     over=0.8), 9)
        t.backward(fresh=P, line=11)
        t.step(0, line=12)
    for line, kw in saturated:
        made = dict(fn="tanh", module="Linear", layer=None, threshold=3.0,
                    shares=[0.9, 0.92, 0.91], init=True, data_input=False)
        made.update(kw)
        t.put(ev.activation_saturated(**made), line)
    return t.trace


def test_an_init_line_is_a_warning_there():
    f = findings(_trace([(5, {})]), SLUG)
    assert len(f) == 1 and f[0].severity is Severity.WARNING and f[0].location.line == 5
    assert "this initialisation leaves a Linear feeding tanh saturated" in f[0].message
    assert "90% to 92%" in f[0].message and "|x| > 3 (tanh)" in f[0].message
    assert "xavier" in f[0].fix


def test_layers_of_one_line_are_one_finding():
    f = findings(_trace([(5, {}), (5, {"fn": "sigmoid", "threshold": 6.0})]), SLUG)
    assert len(f) == 1 and "2 Linear layers feeding sigmoid and tanh" in f[0].message


def test_unscaled_data_says_standardise():
    f = findings(_trace([(4, {"init": False, "data_input": True})]), SLUG)[0]
    assert "fed the data as it is" in f.message and "standardise" in f.fix


def test_raw_pixels_are_left_to_pixels_not_scaled():
    assert findings(_trace([(4, {"init": False, "data_input": True})], pixels=True), SLUG) == []
    # a deeper layer saturated by its own init is still reported beside raw pixels
    assert len(findings(_trace([(5, {})], pixels=True), SLUG)) == 1


def test_folding_keeps_the_finding():
    trace = _trace([(5, {})])
    assert [f.message for f in findings(fold_hard(trace), SLUG)] == \
        [f.message for f in findings(trace, SLUG)]


def _events(build, x_scale=1.0, steps=3, functional=True):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        layer, out = build()
        opt = torch.optim.SGD([*layer.parameters(), *out.parameters()], lr=0.01)
        x = torch.randn(16, 64) * x_scale
        act = torch.tanh if functional else nn.Tanh()
        for _ in range(steps):
            opt.zero_grad()
            out(act(layer(x))).sum().backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("activation_saturated")]


def _wide_init():
    layer = nn.Linear(64, 64)
    nn.init.normal_(layer.weight, std=1.0)
    return layer, nn.Linear(64, 1)


@pytest.mark.parametrize("functional", [True, False])
def test_the_watcher_notes_a_wide_init(functional):
    found = _events(_wide_init, functional=functional)
    assert len(found) == 1 and found[0]["fn"] == "tanh" and found[0]["init"] is True
    assert len(found[0]["shares"]) == 3 and min(found[0]["shares"]) > 0.5


def test_the_watcher_is_silent_on_default_init_short_runs_and_loaded_weights():
    assert _events(lambda: (nn.Linear(64, 64), nn.Linear(64, 1))) == []
    assert _events(_wide_init, steps=2) == []  # fewer calls than judged

    def loaded():
        layer, out = _wide_init()
        layer.load_state_dict(nn.Linear(64, 64).state_dict())  # not as initialised: not judged
        with torch.no_grad():
            layer.weight.mul_(100)
        return layer, out
    assert _events(loaded) == []


def test_unscaled_inputs_point_at_the_layer_built():
    found = _events(lambda: (nn.Linear(64, 64), nn.Linear(64, 1)), x_scale=100.0)
    assert len(found) == 1 and found[0]["init"] is False and found[0]["data_input"] is True


def test_a_sigmoid_read_by_binary_cross_entropy_is_not_starved():
    def run(loss):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            torch.manual_seed(0)
            layer = nn.Linear(256, 1)
            nn.init.normal_(layer.weight, std=1.0)
            opt = torch.optim.SGD(layer.parameters(), lr=0.01)
            x, y = torch.randn(16, 256), (torch.rand(16, 1) > 0.5).float()
            for _ in range(3):
                opt.zero_grad()
                loss(torch.sigmoid(layer(x)), y).backward()
                opt.step()
        return [dict(e.data) for e in rec.trace.of_kind("activation_saturated")]
    # (looked up at the call, as a script does: the instrumentation is in place then)
    assert run(lambda p, y: nn.functional.binary_cross_entropy(p, y)) == []
    assert run(nn.BCELoss()) == []
    assert len(run(lambda p, y: nn.functional.mse_loss(p, y))) == 1  # through a squared error the tails starve it
