"""attention-prefers-distant-keys (GD390): the ``distance_bias`` event of
instrument/distancebias.py for a causal attention whose weights rise with the distance at the
first steps, the source lookup of the bias, and the rule's finding."""

from __future__ import annotations

import ast
import math
import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.distancebias import distant_heads
from graddoctor.rules.attention_prefers_distant_keys import bias_lines
from rule_traces import builder, findings, only

SLUG = "attention-prefers-distant-keys"
T, H, D = 12, 4, 16


def _events(sign: float) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        emb, qkv, head = nn.Embedding(10, D), nn.Linear(D, 3 * D), nn.Linear(D, 10)
        opt = torch.optim.SGD([*emb.parameters(), *qkv.parameters(), *head.parameters()], lr=0.01)
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).view(H, 1, 1)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        for _ in range(2):
            ids = torch.randint(0, 10, (4, T + 1))
            x = emb(ids[:, :-1])
            q, k, v = qkv(x).view(4, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / math.sqrt(D // H) + sign * slopes * (i - j)
            att = scores.masked_fill(j > i, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(4, T, D)
            loss = F.cross_entropy(head(x + y).reshape(-1, 10), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("distance_bias")]


def test_the_watcher_finds_a_bias_that_rewards_distance_and_not_a_penalty():
    found = _events(+1.0)
    assert len(found) == 1 and found[0]["shape"] == [4, H, T, T] and 0 in found[0]["heads"]
    assert found[0]["of"] == H and found[0]["ratio"] > 2
    assert _events(-1.0) == []


def test_distant_heads_skips_an_attention_sink_and_flat_maps():
    flat = torch.tril(torch.ones(T, T))
    flat = (flat / flat.sum(-1, keepdim=True)).unsqueeze(0)
    assert distant_heads(flat) is None
    sink = flat.clone()
    sink[0, :, 0] += 5.0  # most weight on key 0, the rest flat
    assert distant_heads(sink / sink.sum(-1, keepdim=True)) is None


def test_bias_lines_names_the_bias_not_the_scores_that_add_it_nor_the_slopes():
    tree = ast.parse(textwrap.dedent("""\
        def get_slopes(n):
            start = 2 ** (-8 / n)
            slopes = [start ** k for k in range(n)]
            return slopes
        class A:
            def forward(self, q, k):
                alibi = -self.slopes[:, None] * torch.arange(8)
                scores = q @ k.T + alibi
                return scores
        """))
    assert [line for line, _ in bias_lines(tree)] == [7]


def test_the_event_is_a_warning_at_the_bias(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        class A:
            def forward(self, q, k):
                bias = self.slopes * (i - j)
                return q @ k.T + bias
        loss.backward()
        """))
    t = builder()
    t.path = str(script)
    t.put(ev.distance_bias(shape=[4, 4, 12, 12], heads=[0, 1], of=4, ratio=7.5), 5)
    t.put(ev.distance_bias(shape=[4, 4, 13, 13], heads=[0], of=4, ratio=7.0), 5)
    f = only(t, SLUG)  # one bias at two lengths: one finding
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert [r.location.line for r in f.related] == [5]
    assert "2 of its 4 heads" in f.message and "-slopes * (i - j)" in f.fix
    assert findings(builder(), SLUG) == []
