"""causal-mask-reversed (GD340): the attention-mask watcher's ``attention_mask`` events with
problem "reversed" (instrument/attnmask.py), and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings

SLUG = "causal-mask-reversed"
D, T = 8, 6


def _reversed(*masks):
    """The ``reversed`` events of running ``(api, mask)`` attention calls in order."""
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        x = torch.randn(4, T, D, requires_grad=True)
        out = 0
        for api, mask in masks:
            if api == "mha":
                attn = nn.MultiheadAttention(D, 2, batch_first=True)
                out = out + attn(x, x, x, attn_mask=mask)[0].sum()
            else:
                out = out + F.scaled_dot_product_attention(x, x, x, attn_mask=mask).sum()
        out.backward()
    return [(e["api"], e["keys"]) for e in rec.trace.of_kind("attention_mask")
            if e["problem"] == "reversed"]


ONES = torch.ones(T, T, dtype=torch.bool)


def test_a_transposed_causal_mask_is_recorded_in_each_convention():
    assert _reversed(("mha", ONES.tril(-1))) == [("nn.MultiheadAttention", T)]
    assert _reversed(("sdpa", ONES.triu())) == [("F.scaled_dot_product_attention", T)]
    additive = torch.full((T, T), float("-inf")).tril(-1)
    assert _reversed(("mha", additive)) == [("nn.MultiheadAttention", T)]


def test_causal_masks_record_nothing():
    assert _reversed(("mha", ONES.triu(1))) == []
    assert _reversed(("sdpa", ONES.tril())) == []
    assert _reversed(("mha", nn.Transformer.generate_square_subsequent_mask(T))) == []


def test_a_reversed_mask_after_a_causal_one_is_a_backward_model():
    assert _reversed(("mha", ONES.triu(1)), ("mha", ONES.tril(-1))) == []


def test_the_rule_reports_and_leaves_a_leak_read_against_the_targets_to_its_rule():
    t = builder()
    t.put(ev.attention_mask(api="nn.MultiheadAttention", argument="attn_mask", problem="reversed",
                            convention="causal transposed", keys=12), 21)
    t.put(ev.attention_mask(api="nn.MultiheadAttention", argument="key_padding_mask",
                            problem="inverted", convention="True leaves out", fill=0, rows=8,
                            removed=0.62, dtype="bool"), 30)
    found = findings(t, SLUG)
    assert [f.location.line for f in found] == [21]
    assert "before each query" in found[0].message and "triu" in found[0].fix
    assert findings(builder(), SLUG) == []


def _right_to_left(after: str):
    """The ``reversed`` events of a model that embeds ids, attends with the transposed mask,
    then reads the items before each position (``after="previous"``) or after it (``"next"``),
    as embedded positives and as a cross-entropy's targets."""
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        emb = nn.Embedding(20, D)
        attn = nn.MultiheadAttention(D, 2, batch_first=True)
        seqs = torch.randint(0, 20, (4, T + 1))
        inp, other = (seqs[:, 1:], seqs[:, :-1]) if after == "previous" else (seqs[:, :-1], seqs[:, 1:])
        x = emb(inp)
        h = attn(x, x, x, attn_mask=ONES.tril(-1))[0]
        score = (h * emb(other)).sum()
        loss = score + F.cross_entropy((h @ emb.weight.t()).reshape(-1, 20), other.reshape(-1))
        loss.backward()
    return [e["keys"] for e in rec.trace.of_kind("attention_mask") if e["problem"] == "reversed"]


def test_a_right_to_left_model_reading_the_previous_items_is_not_recorded():
    assert _right_to_left("previous") == []
    assert _right_to_left("next") == [T]
