"""linear-layers-collapse (GD178): hand-written ``linear_stack`` events, and the watcher that
records them from the forwards of the first backwards."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "linear-layers-collapse"


def _trace(called_by="container", between=(), widths=(10, 64, 3), listed=True, in_model=True,
           chain=2, ends=True):
    t = builder()
    t.put(ev.linear_stack(widths=list(widths), between=list(between), called_by=called_by,
                          first_at=["train.py", 4, "<module>"], listed=listed,
                          activations_in_model=in_model, chain=chain, ends_in_loss=ends), 5)
    return t


def test_a_stack_is_a_warning_whose_fix_fits_who_called_the_layer():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert "nn.Sequential" in f.fix and "nn.ReLU()" in f.fix and "Linear(10, 64)" in f.message
    assert [r.location.line for r in f.related] == [4]
    user = only(_trace(called_by="user", between=["NativeDropout"]), SLUG)
    assert "nn.Sequential" not in user.fix and "only dropout between them" in user.message


def test_no_event_no_finding():
    assert findings(builder(), SLUG) == []


def test_told_only_where_an_activation_was_evidently_meant():
    assert len(findings(_trace(listed=True, in_model=False, ends=False), SLUG)) == 1
    assert len(findings(_trace(listed=False, in_model=True, ends=True), SLUG)) == 1
    assert len(findings(_trace(listed=False, in_model=False, chain=3, ends=True), SLUG)) == 1
    assert findings(_trace(listed=False, in_model=False, chain=2, ends=True), SLUG) == []  # a toy
    assert findings(_trace(listed=False, in_model=True, ends=False), SLUG) == []


def _stacks(make, x, steps=2, loss=lambda out: out.square().mean()):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = make()  # built under the watch: nn.Sequential's layers are found by their lines
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=0.01)
        for _ in range(steps):
            optimizer.zero_grad()
            loss(model(x)).backward()
            optimizer.step()
    return [e.data for e in rec.trace.of_kind("linear_stack")]


def test_the_watcher_finds_a_missing_activation_once_per_pair():
    found = _stacks(lambda: nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.1), nn.Linear(16, 16),
                                          nn.ReLU(), nn.Linear(16, 2)), torch.randn(4, 6))
    assert [(e["widths"], e["between"], e["called_by"], e["listed"], e["chain"]) for e in found] == [
        ([6, 16, 16], ["NativeDropout"], "container", True, 2)]


def test_the_watcher_is_silent_on_a_bottleneck_an_activation_a_frozen_first_layer_a_hand_relu():
    assert _stacks(lambda: nn.Sequential(nn.Linear(32, 4), nn.Linear(4, 32)), torch.randn(4, 32)) == []
    assert _stacks(lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)),
                   torch.randn(4, 6)) == []

    def frozen():
        model = nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 2))
        model[0].requires_grad_(False)
        return model

    assert _stacks(frozen, torch.randn(4, 6)) == []

    class HandRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 2)

        def forward(self, x):
            h = self.a(x)
            return self.b(h * (h > 0).float())

    assert _stacks(HandRelu, torch.randn(4, 6)) == []


def test_a_dropout_that_passes_its_input_through_does_not_hide_the_activation_before_it():
    # Dropout(0.) hands back the tensor it was given: its grad_fn is the GELU's (a ViT's
    # FeedForward, LayerNorm -> Linear -> GELU -> Dropout(0.) -> Linear -> Dropout(0.))
    assert _stacks(lambda: nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.),
                                          nn.Linear(16, 8), nn.Dropout(0.)), torch.randn(4, 5, 8)) == []
    # with no activation, a pass-through dropout between two layers still leaves a stack
    found = _stacks(lambda: nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.), nn.Linear(16, 16),
                                          nn.ReLU(), nn.Linear(16, 2)), torch.randn(4, 6))
    assert [(e["widths"], e["between"]) for e in found] == [([6, 16, 16], [])]


def test_the_watcher_is_silent_on_an_output_read_by_several_layers_or_by_another_model():
    class Fanned(nn.Module):  # a's output read by q and by k: the fan-out alone silences it
        def __init__(self):
            super().__init__()
            self.a, self.q, self.k, self.act = nn.Linear(6, 16), nn.Linear(16, 2), nn.Linear(16, 2), nn.Tanh()

        def forward(self, x):
            h = self.a(x)
            self.side = self.act(self.k(h)).mean()
            return self.q(h)

    target = torch.randn(4, 2)
    models: list = []

    def make():
        models.append(Fanned())
        return models[-1]

    assert _stacks(make, torch.randn(4, 6),
                   loss=lambda out: F.mse_loss(out, target) + models[-1].side) == []

    class Predictor(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8))
            self.head = nn.Linear(8, 8)

        def forward(self, x):
            return self.head(self.encoder(x))  # the encoder's last layer is not the head's sibling

    assert _stacks(Predictor, torch.randn(4, 6), loss=lambda out: F.mse_loss(out, torch.zeros(4, 8))) == []


def test_a_stack_with_no_activation_in_sight_is_told_only_where_a_loss_function_reads_it():
    def linear():
        return nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 2))

    assert _stacks(linear, torch.randn(4, 6)) == []  # model(x).square().mean(): a demo's loss
    target = torch.randn(4, 2)
    found = _stacks(linear, torch.randn(4, 6), loss=lambda out: F.mse_loss(out, target))
    assert [(e["widths"], e["ends_in_loss"], e["activations_in_model"]) for e in found] == [
        ([6, 16, 2], True, False)]


def test_the_watcher_stops_reading_after_its_window():
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.calls = nn.Linear(6, 16), nn.Linear(16, 2), 0

        def forward(self, x):
            self.calls += 1
            h = self.a(x)
            return self.b(h if self.calls > 4 else F.relu(h))  # the stack only from the 5th forward

    assert _stacks(Late, torch.randn(4, 6), steps=6) == []
