"""pooled-over-channels (GD289): the ``channel_pool`` event of instrument/channelpool.py for a
convolution's output pooled over dim 1 and read by a Linear, the source lookup of the pooling
call, and the rule's finding."""

from __future__ import annotations

import ast
import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules.pooled_over_channels import pooling_calls
from rule_traces import builder, findings, only

SLUG = "pooled-over-channels"


def _events(pool, head_in=16, steps=2) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        conv = nn.Conv1d(3, 16, 1)
        bn = nn.BatchNorm1d(16)
        fc = nn.Linear(head_in, 2)
        opt = torch.optim.SGD([*conv.parameters(), *bn.parameters(), *fc.parameters()], lr=0.01)
        for _ in range(steps):
            x = torch.randn(4, 3, 16)
            loss = F.cross_entropy(fc(F.relu(pool(bn(conv(x))))), torch.randint(0, 2, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("channel_pool")]


def test_the_watcher_finds_a_channel_pooling_read_by_a_linear():
    found = _events(lambda h: torch.max(h, 1)[0])
    assert found == [{"op": "max", "shape": [4, 16, 16], "dims": [1]}]
    assert _events(lambda h: h.amax(-2))[0]["op"] == "amax"  # a negative dim read as written
    assert _events(lambda h: h.mean(1))[0]["op"] == "mean"


def test_the_watcher_stays_silent_on_poolings_over_the_positions_and_transposed_maps():
    assert _events(lambda h: torch.max(h, 2)[0]) == []
    assert _events(lambda h: h.mean(-1)) == []
    assert _events(lambda h: h.transpose(1, 2).max(1).values) == []  # (B, N, C) over N
    assert _events(lambda h: h.mean((1, 2)).unsqueeze(1), head_in=1) == []  # every axis but the batch


def test_pooling_calls_finds_the_literal_dim_1_calls():
    tree = ast.parse(textwrap.dedent("""\
        class M(nn.Module):
            def forward(self, x):
                a = torch.max(x, 1)[0]
                b = x.max(dim=1).values
                c = x.max(2)
                d = x.max(-2)
                return a
        e = torch.max(y, 1)
        """))
    assert [(line, inside) for line, _, inside in pooling_calls(tree, "max", 3)] == \
        [(3, True), (4, True), (6, True), (8, False)]
    assert pooling_calls(tree, "mean", 3) == []


def test_the_event_is_a_warning_at_the_one_pooling_call_in_forward(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        class PointNet(nn.Module):
            def forward(self, x):
                x = torch.max(x, 1)[0]
                return self.fc(x)
        acc = (out.max(1)[1] == y).float().mean()
        loss.backward()
        """))
    t = builder()
    t.path = str(script)
    t.put(ev.channel_pool(op="max", shape=[8, 256, 256], dims=[1]), 6)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert [r.location.line for r in f.related] == [6]
    assert "256 channels" in f.message and "max over dim 2" in f.fix
    assert findings(builder(), SLUG) == []
