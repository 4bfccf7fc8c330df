"""normaliser-changes-sign (GD389): the ``normaliser_sign`` event of instrument/normsign.py for a
quotient whose denominator, a sum of products of activations, takes both signs, and the rule's
finding at the feature map's call."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "normaliser-changes-sign"


def _events(feature, steps=2) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        qkv = nn.Linear(8, 24)
        head = nn.Linear(8, 2)
        opt = torch.optim.SGD([*qkv.parameters(), *head.parameters()], lr=0.01)
        for _ in range(steps):
            x = torch.randn(4, 10, 8)
            q, k, v = qkv(x).chunk(3, dim=-1)
            q, k = feature(q), feature(k)
            kv = torch.einsum("bnd,bne->bde", k, v)
            z = 1.0 / (torch.einsum("bnd,bd->bn", q, k.sum(dim=1)) + 1e-6)
            y = torch.einsum("bnd,bde,bn->bne", q, kv, z)
            loss = F.cross_entropy(head(y.mean(1)), torch.randint(0, 2, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("normaliser_sign")]


def test_the_watcher_finds_a_linear_attention_normaliser_of_both_signs():
    found = _events(F.elu)
    assert len(found) == 1
    e = found[0]
    assert e["op"] == "reciprocal" and e["feature"] == "elu" and e["shape"] == [4, 10]
    assert e["negative"] >= 0.05 and e["positive"] >= 0.05
    raw = _events(lambda t: t)
    assert len(raw) == 1 and raw[0]["feature"] is None  # no feature map: the projections


def test_the_watcher_stays_silent_on_positive_feature_maps():
    assert _events(lambda t: F.elu(t) + 1) == []
    assert _events(lambda t: F.relu(t) + 1e-3) == []
    assert _events(torch.exp) == []


def test_the_rule_points_at_the_one_feature_map_call(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        def feature_map(x):
            return F.elu(x)
        z = 1 / (torch.einsum("bnd,bd->bn", q, k.sum(1)) + eps)
        loss.backward()
        """))
    t = builder()
    t.path = str(script)
    t.put(ev.normaliser_sign(op="reciprocal", sum="BmmBackward0", shape=[4, 10],
                             negative=0.4, positive=0.6, feature="elu"), 4)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 2
    assert [r.location.line for r in f.related] == [4]
    assert "40%" in f.message and "F.elu(x) + 1" in f.fix
    assert findings(builder(), SLUG) == []


def test_without_a_named_feature_map_it_stays_at_the_backward(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("w = w / w.sum(1, keepdim=True)\nloss.backward()\n")
    t = builder()
    t.path = str(script)
    t.put(ev.normaliser_sign(op="div", sum="SumBackward1", shape=[32, 1, 1],
                             negative=0.8, positive=0.2, feature=None), 2)
    f = only(t, SLUG)
    assert f.location.line == 2 and "not constrained positive" in f.message


def _dice_events() -> list[str]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        net = nn.Conv2d(1, 1, 3, padding=1)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(2):
            x = torch.randn(4, 1, 8, 8)
            mask = (x > 0).float()
            scores = net(x)
            inter = (scores * mask).sum((1, 2, 3))
            loss = 1 - ((2 * inter + 1) / (scores.sum((1, 2, 3)) + mask.sum((1, 2, 3)) + 1)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e.kind for e in rec.trace if e.kind in ("normaliser_sign", "overlap_scores")]


def test_a_dice_on_logits_is_left_to_overlap_on_raw_scores():
    kinds = _dice_events()
    assert "overlap_scores" in kinds and "normaliser_sign" not in kinds
