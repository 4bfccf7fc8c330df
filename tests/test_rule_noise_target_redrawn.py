"""noise-target-redrawn (GD262): a regression target that is the first random draw after the
model's forward (a diffusion loss's noise drawn again)."""

from __future__ import annotations

from threading import get_ident

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.redrawn import RedrawnNoiseWatcher
from rule_traces import builder, findings, only

SLUG = "noise-target-redrawn"


class _Rec:
    def __init__(self, params):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.events = []
        self.script_thread = get_ident()

    def here(self, skip=2):
        return ("loc", len(self.events))

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc


def _watch(model, step):
    """The events the watcher records for ``step(model, mse)``, with the module hook called by
    hand at the end of the model's forward (``forward(x)``)."""
    rec = _Rec(list(model.parameters()))
    watcher = RedrawnNoiseWatcher(rec)
    watcher.active = True
    mse = watcher._wrap(F.mse_loss, "mse_loss")

    def forward(*args):
        out = model(*args)
        watcher._post(model, args, out)
        return out

    step(forward, mse)
    return [kind for kind, _ in rec.events], rec.events


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.1), nn.Linear(16, 4))


class _Denoiser(nn.Module):
    """A noise predictor told the noise level: ``forward(x_t, t)``."""

    def __init__(self):
        super().__init__()
        self.net = _net()

    def forward(self, x, t):
        return self.net(x + t[:, None])


def test_noise_drawn_again_after_the_forward_is_recorded():
    def step(forward, mse):
        x0 = torch.randn(8, 4)
        noise = torch.randn_like(x0)
        mse(forward(0.9 * x0 + 0.4 * noise, torch.full((8,), 0.3)), torch.randn_like(x0))
    kinds, events = _watch(_Denoiser(), step)
    assert kinds == ["noise_redrawn"]
    assert events[0][1]["fn"] == "mse_loss" and events[0][1]["numel"] == 32
    assert len(events[0][1]["params"]) == 4


def test_a_random_target_of_the_only_inputs_shape_is_not():
    # a synthetic regression (`mse(model(x), torch.randn(8, 4))`): nothing tells the model a
    # noise level, so the draw is a random target, not the noise of a noise predictor
    def step(forward, mse):
        x0 = torch.randn(8, 4)
        noise = torch.randn_like(x0)
        mse(forward(0.9 * x0 + 0.4 * noise), torch.randn_like(x0))
    assert _watch(_net(), step)[0] == []


def test_the_noise_mixed_into_the_input_is_not():
    def step(forward, mse):
        x0 = torch.randn(8, 4)
        noise = torch.randn_like(x0)
        mse(forward(0.9 * x0 + 0.4 * noise), noise)
    assert _watch(_net(), step)[0] == []


def test_a_target_made_from_a_draw_or_a_second_draw_is_not():
    def step(forward, mse):
        x0 = torch.randn(8, 4)
        pred = forward(x0)
        mse(pred, x0 + 0.1 * torch.randn_like(x0))  # noisy labels
        torch.randn(3)
        mse(pred, torch.randn_like(x0))  # not the first draw after the forward
    assert _watch(_net(), step)[0] == []


def test_a_random_target_of_another_shape_than_the_models_input_is_not():
    def step(forward, mse):
        x = torch.randn(8, 4)
        mse(forward(x)[:, :1], torch.randn(8, 1))  # a synthetic benchmark's regression target
    assert _watch(_net(), step)[0] == []


def test_image_noise_is_compared_channels_apart():
    from graddoctor.instrument.redrawn import _input_shaped

    assert _input_shaped((8, 1, 12, 12), {(8, 2, 12, 12)})  # a time map concatenated
    assert not _input_shaped((8, 1), {(8, 2)}) and not _input_shaped((8, 1, 12, 12), {(8, 2, 6, 6)})


def test_the_draw_before_the_next_forward_is_not_judged_against_an_old_forward():
    rec = _Rec(list(_net().parameters()))
    watcher = RedrawnNoiseWatcher(rec)
    watcher.active = True
    model = _net()
    out = model(torch.randn(8, 4))
    watcher._post(model, (), out)
    watcher.describe_loss(None)  # a backward: the forward's state is dropped
    noise = torch.randn(8, 4)
    watcher._wrap(F.mse_loss, "mse_loss")(model(noise), noise)  # no module hook: no new state
    assert rec.events == []


def test_the_window_closes_after_three_backwards_and_draws_nothing_from_the_users_generator():
    watcher = RedrawnNoiseWatcher(_Rec([]))
    watcher.active = True
    state = torch.get_rng_state()
    watcher._post(None, (), None)
    assert torch.equal(torch.get_rng_state(), state)
    for _ in range(3):
        watcher.describe_loss(None)
    assert not watcher.active and watcher._state is None


def _trace(params, stepped=(0, 1)):
    t = builder(params=list(stepped))
    t.put(ev.noise_redrawn(fn="mse_loss", params=list(params), numel=128), line=9)
    t.clear(list(stepped), line=10)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_at_the_loss_call_when_an_optimizer_steps_the_model():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9 and f.evidence["params"] == [0, 1]
    assert "noise" in f.fix


def test_the_rule_is_silent_when_no_optimizer_steps_the_model():
    assert findings(_trace([5]), SLUG) == []
