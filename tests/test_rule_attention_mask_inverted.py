"""attention-mask-inverted (GD253): the attention-mask watcher's ``attention_mask`` events with
problem "inverted" (instrument/attnmask.py), and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "attention-mask-inverted"
V, D, PAD, T = 20, 8, 0, 10


def _ids(n=6, pad=PAD, left=False):
    ids = torch.full((n, T), pad)
    for i, length in enumerate([3, 5, 7, 9, 4, 6][:n]):
        content = torch.randint(1, V - 1, (length,))
        if left:
            ids[i, T - length:] = content
        else:
            ids[i, :length] = content
    return ids


def _events(mask_of, api="mha", padding_idx=PAD, pad=PAD, left=False):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        embed = nn.Embedding(V, D, padding_idx=padding_idx)
        ids = _ids(pad=pad, left=left)
        x = embed(ids)
        mask = mask_of(ids)
        if api == "mha":
            attn = nn.MultiheadAttention(D, 2, batch_first=True)
            h, _ = attn(x, x, x, key_padding_mask=mask)
        else:
            h = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        h.nan_to_num().sum().backward()
    return [(e["api"], e["argument"], e["convention"], e["fill"])
            for e in rec.trace.of_kind("attention_mask") if e["problem"] == "inverted"]


def test_a_key_padding_mask_true_on_the_tokens_is_recorded():
    assert _events(lambda ids: ids != PAD) == [
        ("nn.MultiheadAttention", "key_padding_mask", "True leaves out", PAD)]


def test_an_sdpa_keep_mask_true_on_the_padding_is_recorded():
    assert _events(lambda ids: (ids == PAD)[:, None, :], api="sdpa") == [
        ("F.scaled_dot_product_attention", "attn_mask", "True attends", PAD)]


def test_an_additive_mask_with_minus_inf_on_the_tokens_is_recorded():
    inverted = lambda ids: torch.zeros(ids.shape).masked_fill(ids != PAD, float("-inf"))[:, None, :]
    assert len(_events(inverted, api="sdpa")) == 1


def test_the_pad_id_is_found_as_the_filler_of_the_shorter_rows():
    assert _events(lambda ids: ids != V - 1, padding_idx=None, pad=V - 1) == [
        ("nn.MultiheadAttention", "key_padding_mask", "True leaves out", V - 1)]
    assert len(_events(lambda ids: ids != V - 1, padding_idx=None, pad=V - 1, left=True)) == 1


def test_correct_masks_in_each_convention_record_nothing():
    assert _events(lambda ids: ids == PAD) == []
    assert _events(lambda ids: (ids != PAD)[:, None, :], api="sdpa") == []
    additive = lambda ids: torch.zeros(ids.shape).masked_fill(ids == PAD, -1e9)[:, None, :]
    assert _events(additive, api="sdpa") == []


def test_a_mask_shared_by_every_sample_or_no_padding_id_records_nothing():
    causal = lambda ids: torch.ones(T, T, dtype=torch.bool).tril()
    assert _events(causal, api="sdpa") == []


def test_the_rule_reports_at_the_attention_call_in_the_conventions_words():
    t = builder()
    t.put(ev.attention_mask(api="nn.MultiheadAttention", argument="key_padding_mask",
                            problem="inverted", convention="True leaves out", fill=0, rows=8,
                            removed=0.62, dtype="bool"), 21)
    t.put(ev.attention_mask(api="F.scaled_dot_product_attention", argument="attn_mask",
                            problem="inverted", convention="True attends", fill=63, rows=8,
                            removed=0.55, dtype="bool"), 30)
    t.put(ev.attention_mask(api="F.scaled_dot_product_attention", argument="attn_mask",
                            problem="additive01", convention="added", values=[0, 1]), 40)
    found = sorted(findings(t, SLUG), key=lambda f: f.location.line)
    assert [f.location.line for f in found] == [21, 30]
    assert "leaves out the positions that are True" in found[0].message
    assert "keeps the positions that are True" in found[1].message and "63" in found[1].message
    assert findings(builder(), SLUG) == []


def test_a_mask_passed_down_among_others_is_reported_where_the_loop_compares_it(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.location import Location
    from graddoctor.rules.attention_mask_inverted import _mask_origin
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "mt.py"
    script.write_text("def forward(s, t, src_pad, tgt_pad):\n"
                      "    return core(s, t,\n"
                      "                src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)\n"
                      "src_pad = src == PAD\n"
                      "tgt_pad = tgt != PAD\n"
                      "forward(src, tgt, src_pad, tgt_pad)\n")
    a = Analysis(TraceBuilder(str(script)).trace)
    at = Location(str(script), 3)
    assert _mask_origin(a, at, "True leaves out").line == 5
    # both masks compared the same way: no one line to change, the call stays the place
    script.write_text(script.read_text().replace("src == PAD", "src != PAD"))
    assert _mask_origin(Analysis(TraceBuilder(str(script)).trace), at, "True leaves out").line == 3
