"""target-visible-to-model (GD244): hand-written traces, and the sequence part of the
``dependency`` events the dependency watcher (instrument/dependency.py) records."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.dependency import _shift
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only

SLUG = "target-visible-to-model"

SCRIPT = """import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y)


class RNNLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(16, 32, batch_first=True,
                           bidirectional=True)
"""


def _probe(t, k=1, future=True, past=True, modules=(), forward=None, line=40, target_line=41):
    seq = {"k": k, "positions": 12, "t": 5, "target_at": [t.path, target_line, "<module>"],
           "future": future, "past": past}
    t.put(ev.dependency(model="GPT", batch=8, source=None, mixed=None, op=None, op_at=None,
                        seq=seq, modules=[list(m) for m in modules], forward=forward), line=line)


def _trace(*probes, path="train.py") -> TraceBuilder:
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=42)
        t.step(line=43)
        if i == 0:
            for kwargs in probes:
                _probe(t, **kwargs)
    return t


def test_a_model_that_sees_later_positions_is_a_warning_at_its_attention(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    path = str(script)
    f = only(_trace({"forward": [path, 7]}, path=path), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert "depends on the input tokens after position 5" in f.message
    assert f.fix == "pass `is_causal=True`: `F.scaled_dot_product_attention(q, k, v, is_causal=True)`"
    assert f.evidence == {"model": "GPT", "shift": 1, "positions": 12, "position": 5,
                          "sees_later_positions": True}


def test_torch_modules_and_bidirectional_rnns_are_named(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    path = str(script)
    decoder = only(_trace({"modules": [("TransformerDecoder", path, 30, "forward", "")]},
                          path=path), SLUG)
    assert decoder.location.line == 30 and "without a causal mask" in decoder.message
    assert "tgt_mask=nn.Transformer.generate_square_subsequent_mask(T)" in decoder.fix
    masked = only(_trace({"modules": [("MultiheadAttention", path, 31, "forward", "masked")]},
                         path=path), SLUG)
    assert "is given a mask, but it lets position t see" in masked.message
    rnn = only(_trace({"modules": [("LSTM", path, 32, "forward", "bidirectional")]}, path=path), SLUG)
    assert rnn.location.line == 16  # the construction, where bidirectional=False goes
    assert "bidirectional=False" in rnn.fix


def test_unshifted_targets_of_a_causal_model_point_at_the_loss():
    f = only(_trace({"k": 0, "future": False}), SLUG)
    assert f.location.line == 41 and "not shifted" in f.message
    assert "logits[:, :-1]" in f.fix and "ids[:, 1:]" in f.fix
    wrong_way = only(_trace({"k": -1, "future": False}), SLUG)
    assert "shifted the wrong way" in wrong_way.message


def test_silent_on_causal_models_autoencoders_and_models_without_a_sequence():
    assert findings(_trace({"future": False}), SLUG) == []  # causal, next-token targets
    assert findings(_trace({"k": 0, "future": True}), SLUG) == []  # an autoencoder
    assert findings(_trace({"k": 0, "future": False, "past": False}), SLUG) == []  # per token
    assert findings(_trace({"k": -1, "future": True}), SLUG) == []


def test_the_shift_needs_most_positions_and_skips_ignored_ones():
    ids = torch.randint(0, 50, (4, 10))
    assert _shift(ids, ids[:, 1:], -100) == 1
    assert _shift(ids, ids, -100) == 0
    assert _shift(ids, torch.cat([ids[:, :1], ids[:, :-1]], 1), -100) == -1
    masked = ids.masked_fill(torch.rand(4, 10) < 0.85, -100)  # an MLM: a few labels, at k = 0
    assert _shift(ids, masked, -100) in (0, None)
    assert _shift(ids, torch.randint(0, 50, (4, 10)), -100) is None


class _LM(nn.Module):
    def __init__(self, causal: bool, V=30, D=8):
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(V, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.head(x + F.scaled_dot_product_attention(q, k, v, is_causal=self.causal))


def _seq_events(causal: bool, shift: int = 1) -> list:
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _LM(causal)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            ids = torch.randint(0, 30, (4, 9))
            x, y = (ids[:, :-1], ids[:, 1:]) if shift else (ids, ids)
            F.cross_entropy(model(x).reshape(-1, 30), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    assert not rec.trace.of_kind("internal_error")
    return [e["seq"] for e in rec.trace.of_kind("dependency")]


def test_the_watcher_tells_a_causal_model_from_one_that_reads_ahead():
    (leaky,) = _seq_events(causal=False)
    assert (leaky["k"], leaky["future"], leaky["past"], leaky["t"]) == (1, True, True, 3)
    (causal,) = _seq_events(causal=True)
    assert (causal["k"], causal["future"], causal["past"]) == (1, False, True)
    (copying,) = _seq_events(causal=True, shift=0)
    assert (copying["k"], copying["future"]) == (0, False)


def test_a_target_copied_from_an_input_column_is_found_and_a_function_of_one_is_not():
    import torch

    from graddoctor.instrument.targetcolumn import matching_column

    x = torch.randn(16, 4)
    assert matching_column(x, x[:, 2].clone()) == 2
    assert matching_column(x, x[:, 2:3].clone()) == 2  # (N, 1) targets
    assert matching_column(x, 3 * x[:, 2]) is None  # a toy task, not a copy
    assert matching_column(x[:, :1], x[:, 0].clone()) is None  # one column: the identity
    assert matching_column(x, torch.ones(16)) is None  # constant
    labels = torch.randint(0, 2, (16,))
    assert matching_column(torch.cat([x, labels[:, None].float()], 1), labels) == 4


def test_targets_sliced_apart_are_reported_at_the_slice_with_a_fix_that_slices_them():
    from pathlib import Path

    from graddoctor.api import check_script

    fixture = Path(__file__).parent.parent / "fixtures/dependency/bad_target_visible_targets_sliced_apart.py"
    [finding] = [f for f in check_script(fixture, config=False).findings
                 if f.rule == "target-visible-to-model"]
    assert finding.location.line == 28
    assert "ids[:, 1:]" in finding.fix and "logits[:, :-1]" not in finding.fix


# -- real-valued targets copied from the input (instrument/seqcopy.py) ------------------------

def test_matches_pairs_target_positions_with_input_steps_exactly():
    from graddoctor.instrument.seqcopy import matches

    series = torch.randn(16, 30)
    x = series[:, :12].unsqueeze(-1)
    late = series[:, 11:14].unsqueeze(-1)  # the window one step late: position 0 is step 11
    assert matches(late, x) == [(0, 11)]
    assert matches(series[:, 12:15].unsqueeze(-1), x) == []  # shifted right: nothing in view
    assert matches(late * 1.5, x) == []  # a function of the input is not a copy
    flat = torch.zeros(16, 12, 1)
    flat[:, 3] = 1.0
    assert matches(flat[:, 3:4], flat) == []  # positions of fewer than 4 values say nothing
    assert matches(late[:4], x[:4]) == []  # too few samples


def test_judge_tells_a_copy_from_memory_teacher_forcing_and_reconstruction():
    from graddoctor.instrument.seqcopy import judge

    # a recurrent reader: the target is the step it outputs at (copy), or one read earlier
    assert judge("rnn", [(0, 11)], 0, 1, False, {11}, 11) == 11
    assert judge("rnn", [(0, 0)], 0, 1, False, {11}, 11) is None  # memory: recalled, not copied
    assert judge("rnn", [(0, 1), (1, 2)], 0, 4, False, {0}, 0) is None  # teacher forcing, shifted
    assert judge("rnn", [(t, t) for t in range(6)], 2, 6, True, {2}, 2) == 2  # unshifted decoder
    assert judge("rnn", [(t, t) for t in range(6)], 2, 6, True, {5}, 5) is None  # an autoencoder
    assert judge("rnn", [(0, 11)], 0, 1, False, set(), None) is None  # not read at all
    # per-step Linear readers: a frame autoencoder reads only its own step
    assert judge("steps", [(t, t) for t in range(6)], 2, 6, True, {2}, 2) is None
    assert judge("steps", [(t, t) for t in range(6)], 2, 6, True, {0, 1, 2}, 2) == 2
    # dense readers see the whole window: a copy unless every target position is in it
    assert judge("dense", [(0, 15)], 0, 4, False, set(range(16)), 15) == 15
    assert judge("dense", [(0, 15)], 0, 1, False, set(range(16)), 15) is None  # target-in-inputs'
    assert judge("dense", [(t, t) for t in range(16)], 7, 16, True, set(range(16)), 15) is None
    # masked reconstruction: the unhidden positions match the input at their own place
    hidden = [(t, t) for t in range(16) if t not in (3, 9)]
    assert judge("dense", hidden, 0, 16, False, set(range(16)), 15, 16) is None
    assert judge("rnn", hidden, 0, 16, False, {0}, 0, 16) is None


class _Decoder(nn.Module):
    def __init__(self, shifted: bool):
        super().__init__()
        self.shifted = shifted
        self.encoder = nn.GRU(1, 8, batch_first=True)
        self.decoder = nn.GRU(1, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, src, tgt):
        _, h = self.encoder(src)
        dec_in = torch.cat([src[:, -1:], tgt[:, :-1]], 1) if self.shifted else tgt
        out, _ = self.decoder(dec_in, h)
        return self.head(out)


def _copy_events(shifted: bool) -> list:
    torch.manual_seed(0)
    series = torch.randn(200)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _Decoder(shifted)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            starts = torch.randint(0, 180, (12,)).tolist()
            src = torch.stack([series[i:i + 8] for i in starts]).unsqueeze(-1)
            tgt = torch.stack([series[i + 8:i + 14] for i in starts]).unsqueeze(-1)
            F.mse_loss(model(src, tgt), tgt).backward()
            opt.step()
            opt.zero_grad()
    assert not rec.trace.of_kind("internal_error")
    return [e["seq"]["copy"] for e in rec.trace.of_kind("dependency") if (e["seq"] or {}).get("copy")]


def test_the_watcher_finds_a_decoder_fed_its_unshifted_targets_and_not_a_shifted_one():
    (copy,) = _copy_events(shifted=False)
    assert (copy["reader"], copy["kind"], copy["whole"], copy["t"], copy["s"]) == ("GRU", "rnn", True, 2, 2)
    assert copy["input"] == 1  # the model's second input, the decoder's
    assert _copy_events(shifted=True) == []


def test_a_copied_target_is_reported_where_the_decoder_input_is_built(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("class M:\n    def forward(self, src, tgt):\n        dec_in = tgt\n"
                      "        out, _ = self.dec(dec_in, h)\n        return out\n")
    path = str(script)
    copy = {"reader": "GRU", "kind": "rnn", "t": 2, "s": 2, "positions": 6, "steps": 6,
            "whole": True, "calls": 1, "input": 1, "fn": "mse_loss",
            "read_at": [path, 4, "forward"], "target_at": [path, 9, "<module>"]}
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=10)
        t.step(line=11)
        if i == 0:
            t.put(ev.dependency(model="M", batch=12, source=None, mixed=None, op=None, op_at=None,
                                seq={"copy": copy}, modules=[], forward=None), line=9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "shifted by one" in f.fix and f.evidence["whole"] is True
    seq2one = dict(copy, whole=False, positions=1, t=0, s=11, steps=12, input=0)
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=10)
        t.step(line=11)
        if i == 0:
            t.put(ev.dependency(model="M", batch=12, source=None, mixed=None, op=None, op_at=None,
                                seq={"copy": seq2one}, modules=[], forward=None), line=9)
    f = only(t, SLUG)
    assert f.location.line == 9 and "i + L - 1" in f.fix  # the model's own input: the target moves


def test_a_window_of_a_series_is_told_from_a_table():
    from graddoctor.instrument.targetcolumn import _window

    series = torch.sin(torch.arange(300, dtype=torch.float32) / 6)
    windows = torch.stack([series[i:i + 24] for i in range(64)])
    assert _window(windows)
    assert not _window(torch.randn(64, 24))  # a table: its columns are unrelated
    assert not _window(windows[:, :3])  # too few columns to say


def test_a_target_that_is_a_windows_last_step_gets_a_forecasters_fix():
    t = builder()
    t.put(ev.target_in_inputs(fn="mse_loss", column=23, columns=24, window=True), line=26)
    for _ in range(3):
        t.backward(fresh=P, line=28)
        t.step(line=29)
    f = only(t, SLUG)
    assert "step 23 of the 24-step window" in f.message and "i + L - 1" in f.fix
    t = builder()
    t.put(ev.target_in_inputs(fn="mse_loss", column=3, columns=8), line=26)
    for _ in range(3):
        t.backward(fresh=P, line=28)
        t.step(line=29)
    assert "drop the target's column" in only(t, SLUG).fix


# -- a recurrent language model's targets that are its input ids (instrument/tokencopy.py) ------
def _lm_copy_events(shift: int, bidirectional: bool = False, autoencoder: bool = False):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        emb = nn.Embedding(30, 8)
        rnn = nn.LSTM(8, 8, bidirectional=bidirectional)
        head = nn.Linear(16 if bidirectional else 8, 30)
        dec_emb = nn.Embedding(30, 8)
        params = [*emb.parameters(), *rnn.parameters(), *head.parameters(), *dec_emb.parameters()]
        source = torch.randint(0, 30, (40, 4))
        for i in range(0, 30, 10):
            data = source[i:i + 10]
            target = source[i + shift:i + shift + 10].reshape(-1)
            out, _ = rnn(emb(data))
            if autoencoder:  # a decoder fed the targets one position later
                out = out + dec_emb(torch.cat([data[:1], data[:-1]]))[..., :out.size(-1)]
            loss = F.nll_loss(torch.log_softmax(head(out).view(-1, 30), dim=1), target)
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-0.1)
    return [e for e in rec.trace if e.kind == "token_copy"], rec.trace


def test_a_recurrent_lm_whose_targets_are_its_inputs_is_recorded_once():
    events, _ = _lm_copy_events(0)
    assert [(e["positions"], e["lookups"]) for e in events] == [(40, 1)]
    assert _lm_copy_events(1)[0] == []  # next-token targets
    assert _lm_copy_events(0, autoencoder=True)[0] == []  # a lookup of the targets one later


def test_the_rule_asks_the_source_for_unidirectional_layers(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    script = tmp_path / "lm.py"
    for text, expected in (("rnn = nn.LSTM(8, 8)\ntarget = source[i:i + n]\nloss.backward()\n", [2]),
                           ("rnn = nn.LSTM(8, 8, bidirectional=True)\nloss.backward()\n", [])):
        script.write_text(text)
        t = TraceBuilder(str(script))
        t.put(ev.token_copy(positions=40, lookups=1), 3)
        found = list(find_rule("target-visible-to-model")().check(Analysis(t.trace)))
        assert [f.location.line for f in found] == expected
        assert all("not shifted" in f.message for f in found)


def _stepwise_events(shift: int, image_first: bool = False):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        emb, cell, head = nn.Embedding(12, 8), nn.GRUCell(8, 8), nn.Linear(8, 12)
        opt = torch.optim.SGD([*emb.parameters(), *cell.parameters(), *head.parameters()], lr=0.1)
        for _ in range(2):
            seq = torch.cat([torch.ones(10, 1, dtype=torch.long), torch.randint(2, 12, (10, 5))], 1)
            h, logits = torch.zeros(10, 8), []
            if image_first:
                h = cell(torch.randn(10, 8), h)
                logits.append(head(h))
            for t in range(5):
                h = cell(emb(seq[:, t]), h)
                logits.append(head(h))
            target = seq if image_first else seq[:, shift:shift + 5]
            loss = F.cross_entropy(torch.stack(logits, 1).reshape(-1, 12), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["lookups"], e["stepwise"]) for e in rec.trace if e.kind == "token_copy"]


def test_a_decoder_loop_whose_step_targets_are_the_tokens_it_is_fed_is_recorded():
    assert _stepwise_events(0) == [(5, True)]
    assert _stepwise_events(1) == []  # the next token at each step
    assert _stepwise_events(0, image_first=True) == []  # show and tell: the image first


def test_a_stepwise_copy_is_told_at_the_targets_slice_without_a_recurrent_layer(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    script = tmp_path / "cap.py"
    script.write_text("cell = nn.GRUCell(8, 8)\ntargets = caps[:, :-1]\nloss.backward()\n")
    t = TraceBuilder(str(script))
    t.put(ev.token_copy(positions=40, lookups=5, stepwise=True), 3)
    found = list(find_rule("target-visible-to-model")().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert "the token it is fed at that step" in found[0].message and "seq[:, 1:]" in found[0].fix


def test_a_causal_mask_is_told_from_an_inverted_or_shifted_one():
    from graddoctor.instrument.dependency import causal_mask
    T = 5
    assert causal_mask(torch.ones(T, T, dtype=torch.bool).triu(1))
    assert causal_mask(torch.nn.Transformer.generate_square_subsequent_mask(T))
    assert causal_mask(torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -1e9))
    assert not causal_mask(torch.ones(T, T, dtype=torch.bool).tril(-1))  # inverted
    assert not causal_mask(torch.ones(T, T, dtype=torch.bool).triu(2))  # one diagonal too high
    assert not causal_mask(torch.ones(T, T).tril())  # a 0/1 float mask is added, not hiding
    assert not causal_mask(torch.ones(T, T, dtype=torch.bool).triu(1).T)  # transposed


def test_a_leak_through_a_softmax_over_the_queries_is_left_to_softmax_wrong_axis():
    t = _trace({})
    assert findings(t, SLUG)
    t.put(ev.softmax_axis(dim=2, summed=3, shape=[8, 2, 8, 8], params=[0], op="softmax"), line=50)
    assert findings(t, SLUG) == []


# -- an unrolled rollout whose target at step k is the state of step k (source) ------------------

def test_rollout_target_read_at_the_states_own_index():
    import ast

    from graddoctor.rules.target_visible_to_model import rollout_targets_unshifted
    src = ("v = norm(traj[idx, t0])\nloss = 0\nfor k in range(3):\n    nxt = model(v)\n"
           "    loss = loss + ((nxt - traj[idx, t0 + k]) ** 2).mean()\n    v = nxt\n")
    found = rollout_targets_unshifted(ast.parse(src))
    assert [(line, state, index) for line, _, _, state, index, _ in found] == [(5, "v", "t0")]
    assert rollout_targets_unshifted(ast.parse(src.replace("t0 + k]", "t0 + k + 1]"))) == []
    # a state the loop never carries is a fresh input at every step, not a rollout
    assert rollout_targets_unshifted(ast.parse(src.replace("    v = nxt\n", ""))) == []
    # another array (targets shifted once) or another position is silent
    assert rollout_targets_unshifted(ast.parse(src.replace("traj[idx, t0 + k]", "targets[idx, t0 + k]"))) == []
    assert rollout_targets_unshifted(ast.parse(src.replace("traj[idx, t0 + k]", "traj[t0 + k, idx]"))) == []


# -- a hand-written label smoothing's target distribution, and a mask bound to None ---------------

def test_a_smoothed_target_distribution_is_read_as_its_classes():
    from graddoctor.instrument.dependency import _IGNORED, _class_ids
    target = torch.tensor([3, 1, 0, 4])
    dist = torch.full((4, 6), 0.1 / 4)
    dist.scatter_(1, target[:, None], 0.9)
    dist[:, 0] = 0
    dist[target == 0] = 0  # padding rows zeroed, as the Annotated Transformer does
    assert _class_ids(dist).tolist() == [3, 1, _IGNORED, 4]
    assert _class_ids(torch.full((4, 6), 1 / 6)) is None  # no top class: no target to read
    assert _class_ids(torch.randn(4, 6)) is None  # not a distribution
    assert _class_ids(torch.zeros(4, 6)) is None  # mostly padding


def test_a_causal_mask_bound_to_none_in_the_loop_is_where_the_leak_is(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules.target_visible_to_model import _mask_set_to_none
    script = tmp_path / "mt.py"
    call = "def f(m, s, t, tgt_mask):\n    return m(s, t,\n             tgt_mask=tgt_mask)\n"
    script.write_text(call + "tgt_mask = None\ny = f(1, 2, 3, tgt_mask)\n")
    a = Analysis(TraceBuilder(str(script)).trace)
    where, name = _mask_set_to_none(a, str(script), 2, "tgt_mask")
    assert (where.line, name) == (4, "tgt_mask")
    # bound to a mask as well (None only at inference, say): the call is still the place
    script.write_text(call + "tgt_mask = None\ntgt_mask = make_mask(5)\n")
    assert _mask_set_to_none(Analysis(TraceBuilder(str(script)).trace), str(script), 2, "tgt_mask") is None
    # the keyword given no name
    script.write_text("y = m(s, t, tgt_mask=None)\n")
    assert _mask_set_to_none(Analysis(TraceBuilder(str(script)).trace), str(script), 1, "tgt_mask") is None


# -- convolutions read by their window (seqcopy.py) ---------------------------------------------

def test_a_conv_window_is_read_from_its_padding_and_dilation():
    from graddoctor.instrument.seqcopy import _conv_window, reader_call

    x = torch.randn(4, 1, 20)
    padded = nn.Conv1d(1, 2, 3, padding=4, dilation=2)
    assert _conv_window(padded, x) == (4, 2, 3, 1)
    assert _conv_window(nn.Conv1d(1, 2, 5, padding="same"), x) == (2, 1, 5, 1)
    assert _conv_window(nn.Conv1d(1, 2, 3, padding=1, padding_mode="circular"), x) is None

    class LeftPadded(nn.Conv1d):  # its own forward pads another tensor than the call's
        def forward(self, inp):
            return super().forward(F.pad(inp, (2, 0)))

    assert reader_call(LeftPadded(1, 2, 3), (x,), LeftPadded(1, 2, 3)(x)) is None
    call = reader_call(padded, (x,), padded(x))
    assert call["kind"] == "conv" and tuple(call["x"].shape) == (4, 20, 1)


def test_a_conv_that_reads_the_step_of_its_target_copies_it():
    from graddoctor.instrument.seqcopy import judge

    shifted = [(t, t + 1) for t in range(19)]  # target t is input step t + 1, the last one absent
    # a window reaching the step after its own position (cropped on the wrong side)
    assert judge("conv", shifted, 0, 20, False, {0, 1, 2}, 2, 20) == 1
    # a causal window (steps up to its own) does not
    assert judge("conv", shifted, 0, 20, False, {0}, 0, 20) is None
    # a target that is the input behind a left padding: a copy when read last, with earlier steps
    padded = [(t, t + 3) for t in range(20)]
    assert judge("conv", padded, 0, 20, False, {0, 1, 2, 3}, 3, 23) == 3
    assert judge("conv", padded, 0, 20, False, {3, 4, 5, 6}, 6, 23) is None  # non-causal: a denoiser


def test_a_target_that_is_the_input_reversed_is_a_reconstruction():
    from graddoctor.instrument.seqcopy import judge

    reversed_pairs = [(t, 9 - t) for t in range(10)]
    assert judge("rnn", reversed_pairs, 0, 10, False, set(range(10)), 9, 10) is None
    late = [(0, 9)]  # a forecaster whose window starts at the input's last step
    assert judge("rnn", late, 0, 3, False, set(range(10)), 9, 10) == 9


SSM_SCRIPT = """import torch
import torch.nn.functional as F
from torch import nn


class S4D(nn.Module):
    def forward(self, u):
        L = u.size(-1)
        k_f = torch.fft.rfft(self.kernel(L), n=2 * L)
        u_f = torch.fft.rfft(u, n=2 * L)
        y = torch.fft.irfft(u_f * k_f, n=L)[..., :L]
        return y
"""

MAMBA_SCRIPT = """import torch
from torch import nn


class Mamba(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(8, 8, kernel_size=4, groups=8, padding=3)

    def forward(self, x):
        l = x.size(1)
        x = self.conv1d(x.transpose(1, 2))[:, :, -l:].transpose(1, 2)
        return x
"""


def test_an_fft_convolution_inverted_at_the_wrong_length_is_the_leak(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SSM_SCRIPT)
    path = str(script)
    f = only(_trace({"forward": [path, 7]}, path=path), SLUG)
    assert f.location.line == 11
    assert "inverts with length L, not the forward transforms' 2*L" in f.message
    assert "n=2 * L" in f.fix


def test_transforms_without_a_length_are_circular(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SSM_SCRIPT.replace(", n=2 * L)", ")"))
    path = str(script)
    f = only(_trace({"forward": [path, 7]}, path=path), SLUG)
    assert f.location.line == 9 and "no n=" in f.message


def test_a_padded_conv_cropped_from_its_start_is_the_leak_not_its_padding(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(MAMBA_SCRIPT)
    path = str(script)
    f = only(_trace({"forward": [path, 10]}, path=path), SLUG)
    assert f.location.line == 12
    assert "[:, :, -l:]" in f.message and "keep the first L outputs" in f.fix


def test_the_step_a_decoder_is_fed_is_found_through_an_assignment():
    import ast as _ast
    from graddoctor.rules.target_visible_to_model import _step_indexed_call
    src = ("for t in range(1, T):\n"          # 1
           "    inp = trg[t]\n"                # 2
           "    out, h = dec(inp, h)\n"        # 3
           "    outputs[t] = out\n")           # 4
    assert _step_indexed_call(_ast.parse(src)) == 2
    assert _step_indexed_call(_ast.parse(src.replace("dec(inp, h)", "dec(x0, h)"))) is None
