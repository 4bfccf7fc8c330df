"""attention-mask-added (GD254): the attention-mask watcher's ``attention_mask`` events with
problem "additive01" (instrument/attnmask.py), and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "attention-mask-added"
D, N, T = 8, 4, 6


def _events(mask, api="mha", argument="key_padding_mask"):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        x = torch.randn(N, T, D, requires_grad=True)
        if api == "mha":
            attn = nn.MultiheadAttention(D, 2, batch_first=True)
            h, _ = attn(x, x, x, **{argument: mask})
        else:
            h = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        h.nan_to_num().sum().backward()
    return [(e["api"], e["argument"], e["values"])
            for e in rec.trace.of_kind("attention_mask") if e["problem"] == "additive01"]


PAD = torch.zeros(N, T, dtype=torch.bool)
PAD[:, 4:] = True


def test_a_float_zero_one_mask_is_recorded_for_each_entry_point():
    assert _events(PAD.float()) == [("nn.MultiheadAttention", "key_padding_mask", [0, 1])]
    causal = torch.ones(T, T).triu(1)
    assert _events(causal, argument="attn_mask") == [("nn.MultiheadAttention", "attn_mask", [0, 1])]
    assert _events((~PAD).float()[:, None, :], api="sdpa") == [
        ("F.scaled_dot_product_attention", "attn_mask", [0, 1])]
    assert _events(-PAD.float()[:, None, :], api="sdpa") == [
        ("F.scaled_dot_product_attention", "attn_mask", [0, -1])]


def test_boolean_and_additive_masks_and_biases_record_nothing():
    assert _events(PAD) == []
    assert _events(torch.zeros(N, T).masked_fill(PAD, float("-inf"))) == []
    assert _events(torch.zeros(N, 1, T).masked_fill(PAD[:, None], -1e9), api="sdpa") == []
    position = torch.arange(T).float()
    assert _events(-(position[None] - position[:, None]).abs(), api="sdpa") == []  # ALiBi
    assert _events(torch.zeros(T, T), api="sdpa") == []  # zeros only: no mask meant


def test_the_rule_reports_at_the_attention_call():
    t = builder()
    t.put(ev.attention_mask(api="nn.MultiheadAttention", argument="key_padding_mask",
                            problem="additive01", convention="added", values=[0, 1]), 17)
    f = only(t, SLUG)
    assert f.location.line == 17 and "added to the attention scores" in f.message
    assert "bool" in f.fix
    t2 = builder()
    t2.put(ev.attention_mask(api="nn.MultiheadAttention", argument="key_padding_mask",
                             problem="inverted", convention="True leaves out", fill=0, rows=8,
                             removed=0.6, dtype="bool"), 17)
    assert findings(t2, SLUG) == []
