"""conditioning-drawn-twice (GD273): a model given a random draw (a timestep) that is a second
draw of the same call its other input was built from."""

from __future__ import annotations

from threading import get_ident

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.drawtwin import DrawTwinWatcher
from rule_traces import builder, findings, only

SLUG = "conditioning-drawn-twice"


class _Loc:
    path = "x.py"

    def __init__(self, line):
        self.line = line


class _Rec:
    def __init__(self):
        self.events = []
        self.script_thread = get_ident()
        self.line = 0

    def here(self, skip=2):
        self.line += 1
        return _Loc(self.line)

    def emit_aside(self, made, loc=None):
        self.events.append((made, loc))

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        self.retired = True


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 4)
        self.lin = nn.Linear(8, 4)

    def forward(self, x, t):
        return self.lin(torch.cat([x, self.emb(t)], -1))


def _step(given_twice: bool):
    """A DDPM-like step under the watcher, the draws and the module call told by hand."""
    watcher = DrawTwinWatcher(_Rec())
    net = _Net()

    def draw(fn, *args):
        out = getattr(torch, fn)(*args)
        watcher._drawn(fn, args, {}, out)
        return out

    try:
        ab = torch.linspace(0.99, 0.01, 50)
        x0 = torch.randn(16, 4)
        t = draw("randint", 0, 50, (16,))
        noise = draw("randn_like", x0)
        x_t = ab[t].sqrt()[:, None] * x0 + (1 - ab[t]).sqrt()[:, None] * noise
        given = draw("randint", 0, 50, (16,)) if given_twice else t
        watcher._pre(net, (x_t, given))
        out = net(x_t, given)
        watcher._post(net, (x_t, given), out)
        watcher.describe_loss(out.sum())
    finally:
        watcher._stop()
    return watcher.rec.events


def test_a_timestep_drawn_again_is_recorded_at_its_draw():
    events = _step(True)
    assert len(events) == 1
    (kind, data), loc = events[0]
    assert kind == "draw_twin" and data["fn"] == "randint" and data["module"] == "_Net"
    assert data["twin_line"] == 1 and loc.line == 3 and data["position"] == 1


def test_the_timestep_that_made_the_input_is_silent():
    assert _step(False) == []


def test_a_concatenated_view_of_a_second_draw_is_recorded_and_the_mode_is_gone_after():
    watcher = DrawTwinWatcher(_Rec())
    depth = torch._C._len_torch_function_stack()
    try:
        t = torch.rand(8, 1)
        watcher._drawn("rand", (8, 1), {}, t)
        assert torch._C._len_torch_function_stack() == depth + 1
        x = (1 - t) * torch.zeros(8, 3) + t * torch.ones(8, 3)
        t2 = torch.rand(8)
        watcher._drawn("rand", (8,), {}, t2)
        torch.cat([x, t2[:, None]], 1)
        t3 = torch.rand(8, 1)
        watcher._drawn("rand", (8, 1), {}, t3)
        torch.cat([x, t3 * 2], 1)  # not the draw's values: not judged
        torch.cat([x, t3[:, 0:1]], 1)
    finally:
        watcher._stop()
    assert torch._C._len_torch_function_stack() == depth
    assert [data["fn"] for (kind, data), _ in watcher.rec.events] == ["rand"]
    assert watcher.rec.events[0][1].line == 3  # t3 (of t's very call), not t2 (another shape)


def test_the_window_closes_after_three_backwards():
    watcher = DrawTwinWatcher(_Rec())
    for _ in range(3):
        watcher._drawn("rand", (4,), {}, torch.rand(4))
        watcher.describe_loss(None)
    assert watcher.closed and watcher._mode is None
    watcher._drawn("rand", (4,), {}, torch.rand(4))
    assert watcher._mode is None and watcher._draws == []


def _trace(twin):
    t = builder(params=[0])
    t.put(ev.draw_twin(fn="randint", module="UNet", position=1, twin_line=twin, shape=[64]), line=9)
    t.clear([0], line=10)
    t.backward(fresh=[0], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_points_at_the_draw_and_names_its_twin():
    f = only(_trace(7), SLUG)
    assert f.location.line == 9 and "line 7" in f.message and "line 7" in f.fix
    f = only(_trace(None), SLUG)
    assert "an earlier draw" in f.message


def test_the_rule_is_silent_without_events():
    t = builder(params=[0])
    t.backward(fresh=[0], line=11)
    assert findings(t, SLUG) == []


def _joined(build):
    """The events of one ``cat`` of the columns ``build(draw)`` returns, under the watcher."""
    watcher = DrawTwinWatcher(_Rec())

    def draw(fn, *args):
        out = getattr(torch, fn)(*args)
        watcher._drawn(fn, args, {}, out)
        return out

    try:
        torch.cat(build(draw), 1)
    finally:
        watcher._stop()
    return [data for (kind, data), _ in watcher.rec.events]


def test_two_random_columns_one_scaled_are_two_features_not_a_timestep_drawn_twice():
    # a PINN's collocation points, a synthetic table's features: independent coordinates
    assert _joined(lambda draw: [draw("rand", 64, 1) * 2.0, draw("rand", 64, 1)]) == []
    assert _joined(lambda draw: [draw("rand", 64, 1) * 3 + 0.5, draw("randint", 1, 6, (64, 1)).float(),
                                 draw("rand", 64, 1), draw("rand", 64, 1) * 10]) == []


def test_a_second_draw_beside_an_input_mixed_from_its_twin_is_still_recorded():
    # one value per sample too, but mixed with another draw (a 1-D flow's interpolated point)
    def flow(draw):
        t = draw("rand", 64, 1)
        x_t = (1 - t) * draw("randn", 64, 1) + t * 2.0
        return [x_t, draw("rand", 64, 1)]

    assert [d["fn"] for d in _joined(flow)] == ["rand"]
    # several values per sample built from the twin alone (noise-free interpolation of data)
    assert [d["fn"] for d in _joined(lambda draw: [draw("rand", 64, 1) * torch.ones(64, 3),
                                                     draw("rand", 64, 1)])] == ["rand"]
