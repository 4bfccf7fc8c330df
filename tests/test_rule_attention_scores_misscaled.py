"""attention-scores-misscaled (GD157): attention scores scaled by sqrt(d) instead of 1/sqrt(d),
or by 1/sqrt of another size of the scores, read from the graph below each softmax."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.analysis.source import score_scalings
from graddoctor.instrument.attnaxis import SoftmaxAxisWatcher, misscaled_scores, scale_verdict
from rule_traces import builder, findings, only

SLUG = "attention-scores-misscaled"
B, H, T, D = 4, 2, 6, 64  # heads of 32


def _qkv(d=D, heads=H, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(8, 3 * d)
    x = torch.randn(B, T, 8)
    q, k, v = lin(x).view(B, T, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    return q, k, v


def _verdict(scores_of, **kw):
    q, k, v = _qkv(**kw)
    weights = scores_of(q, k)
    return misscaled_scores(weights.grad_fn)


def test_the_verdict_table():
    assert scale_verdict(math.sqrt(64), 64, (4, 6, 6)) == ("multiplied", 64)
    assert scale_verdict(1 / math.sqrt(64), 64, (4, 6, 6)) is None
    assert scale_verdict(1.0, 64, (4, 6, 6)) is None  # T5
    assert scale_verdict(1 / 64, 64, (64, 6, 6)) is None  # muP, even where 64 is another size
    assert scale_verdict(1 / 8, 8, (64, 6, 6)) is None  # muP's 1/d = 1/sqrt(64) of the batch
    assert scale_verdict(1 / math.sqrt(16), 64, (16, 6, 6)) == ("other_dim", 16)
    assert scale_verdict(1 / math.sqrt(16), 64, (4, 6, 6)) is None  # 16 is no size of the scores
    assert scale_verdict(2.0, 4, (4, 6, 6)) is None  # heads too small to judge
    assert scale_verdict(10.0, 64, (4, 6, 6)) is None  # some other temperature


@pytest.mark.parametrize("scores_of, how", [
    (lambda q, k: F.softmax(q @ k.transpose(-2, -1) * math.sqrt(q.size(-1)), dim=-1), "multiplied"),
    (lambda q, k: torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * q.size(-1) ** 0.5, -1), "multiplied"),
    (lambda q, k: ((q * q.size(-1) ** 0.5) @ k.transpose(-2, -1)).softmax(-1), "multiplied"),
    (lambda q, k: (torch.tensor(32.0).sqrt() * (q @ k.mT)).softmax(-1), "multiplied"),
    (lambda q, k: (q @ k.mT * math.sqrt(32)).masked_fill(torch.ones(T, T).triu(1).bool(), -1e9)
     .softmax(-1), "multiplied"),
    (lambda q, k: (torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.size(0))).softmax(-1),
     "other_dim"),
])
def test_scores_scaled_the_wrong_way_are_found_in_every_form(scores_of, how):
    found = _verdict(scores_of)
    assert found is not None and found[0] == how and found[2] == 32
    assert found[4] == (B, H, T, T)


@pytest.mark.parametrize("scores_of", [
    lambda q, k: F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1),
    lambda q, k: ((q * 32 ** -0.5) @ k.mT).softmax(-1),
    lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q * 32 ** -0.25, k * 32 ** -0.25).softmax(-1),
    lambda q, k: (q @ k.mT).softmax(-1),  # T5
    lambda q, k: (q @ k.mT / 32).softmax(-1),  # muP
    lambda q, k: (q @ k.mT * math.sqrt(32) / 32 + torch.randn(H, T, T)).softmax(-1),  # bias
    lambda q, k: (q @ k.mT / nn.Parameter(torch.tensor(0.2))).softmax(-1),  # learned
    lambda q, k: (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).mT * math.sqrt(32)).softmax(-1),
    lambda q, k: (q @ k.mT * math.sqrt(32)).softmax(dim=2),  # not over the keys: another rule's
])
def test_right_or_deliberate_scales_stay_silent(scores_of):
    assert _verdict(scores_of) is None


def test_a_product_with_a_parameter_is_no_query_key_product():
    torch.manual_seed(0)
    head = nn.Linear(8, 16)
    weight = nn.Parameter(torch.randn(4, 16))
    h = head(torch.randn(64, 8))
    # a temperature of 2 over a classifier's logits: 1/2 = 1/sqrt(4), 4 classes
    assert misscaled_scores(F.softmax(h @ weight.t() / 2, dim=-1).grad_fn) is None
    assert misscaled_scores(F.softmax(h @ weight.t() * 4, dim=-1).grad_fn) is None


def test_the_watcher_reports_once_with_the_parameters(monkeypatch):
    events = []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
            pass

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def internal_error(self, where, exc):
            raise exc

    watcher = SoftmaxAxisWatcher(_Rec())
    for scale in (math.sqrt(32), math.sqrt(32), 1 / math.sqrt(32)):
        q, k, v = _qkv()
        loss = (torch.softmax(q @ k.mT * scale, dim=-1) @ v).sum()
        watcher.describe_loss(loss)
    assert [made[0] for made in events] == ["attention_scale"]
    assert events[0][1]["how"] == "multiplied" and events[0][1]["d"] == 32
    assert events[0][1]["factor"] == pytest.approx(math.sqrt(32))


def _trace(params, how="multiplied", n=32):
    t = builder(params=[0, 1])
    t.put(ev.attention_scale(how=how, n=n, d=32, factor=math.sqrt(32) if how == "multiplied"
                             else 1 / math.sqrt(n), shape=[4, 2, 6, 6], params=list(params)),
          line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_trains_the_scores():
    f = only(_trace([0, 1]), SLUG)
    assert f.evidence["d"] == 32 and "sqrt(32)" in f.message
    assert "math.sqrt(d)" in f.fix and "32" in f.fix
    g = only(_trace([0], how="other_dim", n=4), SLUG)
    assert "1/sqrt(4)" in g.message


def test_the_rule_is_silent_when_nothing_trained_makes_the_scores():
    assert findings(_trace([7]), SLUG) == []


def test_the_scaling_lines_read_which_way_they_move_the_scores(tmp_path):
    path = tmp_path / "attn.py"
    path.write_text(textwrap.dedent("""\
        s1 = q @ k.mT * math.sqrt(d)
        s2 = q @ k.mT / math.sqrt(d)
        s3 = (q @ k.mT) * d ** -0.5
        s4 = q @ k.mT * self.scale
        s5 = q.matmul(k.mT)
        s5 *= head_dim ** 0.5
        s6 = x * 2
        s7 = q @ k.mT / (1 / math.sqrt(d))
        """))
    found = {line: (direction, product) for line, _, direction, product in score_scalings(str(path))}
    assert found == {1: ("up", True), 2: ("down", True), 3: ("down", True), 4: ("named", True),
                     6: ("up", False), 8: ("up", True)}
