"""last-step-is-padding (GD252): the ``last_step_padded`` event of instrument/batchpairs.py for
a recurrent layer's last output step read over a right-padded batch, and the rule's finding."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.batchpairs import filled_rows, padded_rows
from rule_traces import builder, findings, only

SLUG = "last-step-is-padding"


def test_the_event_is_a_warning_at_the_layer_call():
    t = builder()
    t.put(ev.last_step_padded(module="LSTM", rows=32, length=19, padded=28), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert f.evidence == {"module": "LSTM", "rows": 32, "length": 19, "padded_rows": 28}
    assert "28 of 32 rows" in f.message and findings(builder(), SLUG) == []


def test_padded_rows_wants_trailing_runs_of_different_lengths():
    lengths = torch.tensor([3, 5, 8, 2, 8, 6])
    pad = torch.arange(8)[None] >= lengths[:, None]
    assert padded_rows(pad) == 4
    assert padded_rows(pad.flip(1)) == 0  # left padding
    assert padded_rows(torch.zeros(6, 8, dtype=torch.bool)) == 0  # one length
    same = torch.zeros(6, 8, dtype=torch.bool)
    same[:, -2:] = True
    assert padded_rows(same) == 0  # one run length for all: an end step
    sparse = pad.clone()
    sparse[:, 0] = True  # empty steps inside the rows too
    assert padded_rows(sparse) == 0
    ids = torch.randint(1, 9, (6, 8)).masked_fill(pad, 0)
    assert filled_rows(ids) == 4 and filled_rows(ids.flip(1)) == 0


def _events(forward) -> list[tuple]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        lengths = torch.randint(2, 10, (16,))
        tokens = pad_sequence([torch.randint(1, 30, (int(n),)) for n in lengths], batch_first=True)
        embed = nn.Embedding(30, 8)
        rnn = nn.GRU(8, 8, batch_first=True)
        for _ in range(2):
            summary = forward(embed, rnn, tokens, lengths)
            nn.functional.cross_entropy(summary, torch.randint(0, 8, (16,))).backward()
    return [(e["module"], e["rows"], e["padded"] > 8) for e in rec.trace.of_kind("last_step_padded")]


def test_the_watcher_finds_the_last_step_of_right_padded_ids_and_features():
    assert _events(lambda embed, rnn, tokens, n: rnn(embed(tokens))[0][:, -1]) == [("GRU", 16, True)]
    assert _events(lambda embed, rnn, tokens, n: rnn(embed(tokens) * (tokens > 0)[..., None])[0][:, -1, :]) \
        == [("GRU", 16, True)]


def test_the_watcher_is_silent_on_summaries_that_read_no_padding():
    gathered = lambda embed, rnn, tokens, n: rnn(embed(tokens))[0][torch.arange(16), n - 1]  # noqa: E731
    first = lambda embed, rnn, tokens, n: rnn(embed(tokens))[0][:, 0]  # noqa: E731
    packed = lambda embed, rnn, tokens, n: rnn(pack_padded_sequence(  # noqa: E731
        embed(tokens), n, batch_first=True, enforce_sorted=False))[1][-1]
    left = lambda embed, rnn, tokens, n: rnn(embed(tokens.flip(1)))[0][:, -1]  # noqa: E731
    for forward in (gathered, first, packed, left):
        assert _events(forward) == []


def test_a_packed_event_is_told_as_zeros_of_pad_packed_sequence():
    t = builder()
    t.put(ev.last_step_padded(module="GRU", rows=16, length=9, padded=13, packed=True), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING
    assert "pad_packed_sequence" in f.message and "13 of 16 rows" in f.message
    assert f.evidence["packed"] is True and "h_n[-1]" in f.fix


def _packed_events(read, lengths=None, batch_first=True, total_length=None) -> list[tuple]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        n = lengths if lengths is not None else torch.randint(2, 10, (16,))
        tokens = pad_sequence([torch.randint(1, 30, (int(k),)) for k in n], batch_first=batch_first)
        embed = nn.Embedding(30, 8)
        rnn = nn.GRU(8, 8, batch_first=batch_first)
        for _ in range(2):
            out, h_n = rnn(pack_padded_sequence(embed(tokens), n, batch_first=batch_first,
                                                enforce_sorted=False))
            padded, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=total_length)
            summary = read(padded, h_n, n)
            nn.functional.cross_entropy(summary, torch.randint(0, 8, (16,))).backward()
    return [(e["module"], e["rows"], e["padded"] > 8, e["packed"], e["time_dim"])
            for e in rec.trace.of_kind("last_step_padded")]


def test_the_watcher_finds_the_last_position_of_a_padded_packed_output():
    assert _packed_events(lambda out, h, n: out[:, -1]) == [("GRU", 16, True, True, 1)]
    assert _packed_events(lambda out, h, n: out[-1], batch_first=False) == [("GRU", 16, True, True, 0)]
    assert _packed_events(lambda out, h, n: out.select(1, 11), total_length=12) \
        == [("GRU", 16, True, True, 1)]
    assert _packed_events(lambda out, h, n: out.transpose(0, 1)[-1]) == [("GRU", 16, True, True, 0)]


def test_the_watcher_is_silent_on_packed_summaries_that_read_no_padding():
    reads = (lambda out, h, n: h[-1],
             lambda out, h, n: out[torch.arange(16), n - 1],
             lambda out, h, n: out[:, 0],
             lambda out, h, n: out[:, :, -1][:, :1].expand(16, 8))  # a feature, not a step
    for read in reads:
        assert _packed_events(read) == []
    assert _packed_events(lambda out, h, n: out[:, -1], lengths=torch.full((16,), 7)) == []


def test_the_read_is_found_through_pad_packed_sequence(tmp_path):
    from graddoctor.analysis.source import output_read_line
    path = tmp_path / "model.py"
    path.write_text("def forward(self, packed):\n"
                    "    packed_out, h = self.rnn(packed)\n"
                    "    out, lengths = pad_packed_sequence(packed_out, batch_first=True)\n"
                    "    return self.head(out[:, -1, :])\n")
    assert output_read_line(str(path), 2, 1, 8, 9, through=frozenset({"pad_packed_sequence"})) \
        == (4, "out[:, -1, :]")
    assert output_read_line(str(path), 2, 1, 8, 9) is None
