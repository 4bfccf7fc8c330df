"""padding-attended (GD265): the attention-mask watcher's ``attention_mask`` events with problem
"missing" (instrument/attnmask.py), and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "padding-attended"
V, D, PAD, T = 20, 8, 0, 10


def _padded(left=False):
    ids = torch.full((6, T), PAD)
    for i, length in enumerate([3, 5, 7, 10, 4, 6]):
        content = torch.randint(1, V, (length,))
        if left:
            ids[i, T - length:] = content
        else:
            ids[i, :length] = content
    return ids


def _missing(ids, call, padding_idx=PAD):
    """The ``missing`` events of one attention ``call(x, embed)`` over ``embed(ids)``."""
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        embed = nn.Embedding(V, D, padding_idx=padding_idx)
        call(embed(ids)).sum().backward()
    return [e for e in rec.trace if e.kind == "attention_mask" and e["problem"] == "missing"]


def _mha(**kw):
    attn = nn.MultiheadAttention(D, 2, batch_first=True)
    return lambda x: attn(x, x, x, **kw)[0]


def _sdpa(**kw):
    return lambda x: F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], **kw)


def test_unmasked_attention_over_a_padded_batch_is_recorded():
    torch.manual_seed(0)
    (e,) = _missing(_padded(), _mha())
    assert e["api"] == "nn.MultiheadAttention" and e["fill"] == PAD and e["padded_rows"] == 5
    (e,) = _missing(_padded(left=True), _sdpa())
    assert e["api"] == "F.scaled_dot_product_attention" and e["rows"] == 6


def test_masked_causal_or_unpadded_attention_is_not_recorded():
    torch.manual_seed(0)
    ids = _padded()
    assert _missing(ids, _mha(key_padding_mask=ids == PAD)) == []
    assert _missing(ids, _sdpa(attn_mask=(ids != PAD)[:, None, None, :])) == []
    assert _missing(ids, _sdpa(is_causal=True)) == []
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert _missing(ids, _mha(attn_mask=causal)) == []
    assert _missing(torch.randint(1, V, (6, T)), _mha()) == []  # nothing padded


def test_a_padding_id_among_random_tokens_is_no_padding():
    # the pad id drawn as a word like any other (random ids over the whole vocabulary): it sits
    # inside the rows as often as at their ends
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 4, (6, T), generator=g)
    assert _missing(ids, _mha()) == []


def _trace(line_text=None, api="nn.MultiheadAttention"):
    t = builder()
    t.put(ev.attention_mask(api=api, argument="key_padding_mask", problem="missing",
                            convention="none", fill=0, rows=8, padded_rows=7, padded=0.41), 12)
    return t


def test_the_finding_names_the_padding_and_a_fix_for_the_api():
    f = only(_trace(), SLUG)
    assert f.location.line == 12 and "id 0" in f.message and "41%" in f.message
    assert "key_padding_mask=(ids == 0)" in f.fix
    f = only(_trace(api="F.scaled_dot_product_attention"), SLUG)
    assert "attn_mask=(ids != 0)" in f.fix


def test_other_mask_problems_are_not_this_rule():
    t = builder()
    t.put(ev.attention_mask(api="nn.MultiheadAttention", argument="key_padding_mask",
                            problem="inverted", convention="True leaves out", fill=0, rows=8,
                            removed=0.6, dtype="bool"), 3)
    assert findings(t, SLUG) == []
