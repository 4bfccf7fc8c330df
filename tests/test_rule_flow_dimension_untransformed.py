"""flow-dimension-untransformed (GD347): the graph reading of instrument/flowidentity.py and the
rule over a hand-written trace."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.instrument.flowidentity import FlowIdentityWatcher
from rule_traces import builder, findings

SLUG = "flow-dimension-untransformed"


class _Rec:
    def __init__(self):
        self.told = []

    def emit_aside(self, made, loc):
        self.told.append(made[1])


def _told(loss):
    watcher = FlowIdentityWatcher.__new__(FlowIdentityWatcher)
    watcher.rec, watcher._done = _Rec(), set()
    watcher._judge(loss.grad_fn, None)
    return watcher.rec.told


def _flow(mask_of, layers=3, scale=0.5):
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    nets = [torch.nn.Linear(4, 4) for _ in range(layers)]
    z, log_det = x, 0
    for i, net in enumerate(nets):
        mask = mask_of(i)
        s = torch.tanh(net(z * mask)) * scale * (1 - mask)
        z = z * mask + (1 - mask) * (z * torch.exp(s))
        log_det = log_det + s.sum(1)
    return -(-0.5 * (z ** 2).sum(1) + log_det).mean()


def test_coordinates_no_layer_transforms_are_told():
    same = torch.tensor([1.0, 0.0, 1.0, 0.0])
    told, = _told(_flow(lambda i: same))
    assert told["dims"] == [0, 2] and told["features"] == 4


def test_alternating_masks_and_a_flow_still_at_the_identity_are_not():
    same = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert _told(_flow(lambda i: same if i % 2 == 0 else 1 - same)) == []
    assert _told(_flow(lambda i: same, scale=0.0)) == []  # every column equal: no verdict


def _masked_flow(masks, zero):
    """normflows' MaskedAffineFlow: the kept half ``b * z``, the other ``(1 - b) * (z - t) *
    exp(-s)``; the data reach the graph only masked (``b * x`` read by the first layer's nets)."""
    torch.manual_seed(0)
    x = torch.randn(16, 2)
    z, log_det = x, 0
    for b in reversed(masks):
        s_net, t_net = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        if zero:
            for net in (s_net, t_net):
                torch.nn.init.zeros_(net.weight)
                torch.nn.init.zeros_(net.bias)
        z_masked = b * z
        scale, trans = s_net(z_masked), t_net(z_masked)
        z = z_masked + (1 - b) * (z - trans) * torch.exp(-scale)
        log_det = log_det - ((1 - b) * scale).sum(1)
    return -(-0.5 * (z ** 2).sum(1) + log_det).mean()


def test_a_masked_flow_still_at_the_identity_is_not_judged_on_the_half_its_data_show():
    b = torch.tensor([[1.0, 0.0]])
    alternating = [b, 1 - b, b, 1 - b]
    assert _told(_masked_flow(alternating, zero=True)) == []  # only x's kept column is visible
    assert _told(_masked_flow(alternating, zero=False)) == []
    told, = _told(_masked_flow([b] * 4, zero=False))  # the same mask in every layer
    assert told["dims"] == [0]


def test_the_rule_warns_with_the_columns():
    t = builder()
    t.put(ev.flow_identity_dims(dims=[0], features=2, line=9), line=9)
    t.backward(fresh=[0], line=9)
    t.step(0, line=10)
    f, = findings(t.trace, SLUG)
    assert "column 0 (of 2)" in f.message and "alternate the masks" in f.fix


def test_a_comprehension_giving_every_layer_the_same_mask_is_the_line():
    import ast

    from graddoctor.rules.flow_dimension_untransformed import _same_mask_every_layer

    src = ("masks = [torch.tensor([1.0, 0.0]) for i in range(6)]\n"
           "layers = nn.ModuleList([Coupling(m) for m in masks])\n")
    assert _same_mask_every_layer(ast.parse(src)) == 1
    src = ("masks = [torch.tensor([1.0, 0.0]) if i % 2 == 0 else torch.tensor([0.0, 1.0]) for i in range(6)]\n"
           "layers = nn.ModuleList([Coupling(self.mask) for _ in range(4)])\n")
    assert _same_mask_every_layer(ast.parse(src)) == 2
    assert _same_mask_every_layer(ast.parse("layers = [Coupling() for _ in range(4)]\n")) is None
