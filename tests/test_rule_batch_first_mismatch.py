"""batch-first-mismatch (GD240): hand-written traces, and the ``batch_layout`` events the
batch-first watcher (instrument/batchfirst.py) records."""

from __future__ import annotations

import io

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only

SLUG = "batch-first-mismatch"

SCRIPT = """import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 16, num_layers=2)
        layer = nn.TransformerEncoderLayer(16, 2)
        self.encoder = nn.TransformerEncoder(layer, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.encoder(out)
"""


def _layout(t, layout="batch_first", line=8, cls="LSTM", shape=(32, 12), source="loader",
            call=13):
    t.put(ev.batch_layout(cls=cls, layout=layout, shape=list(shape), batch=shape[0 if layout == "batch_first" else 1],
                          source=source, forwards=2 if layout == "batch_first" else 1,
                          call=[t.path, call, "forward"]), line=line)


def _trace(*layouts, path="train.py") -> TraceBuilder:
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=20)
        t.step(line=21)
        if i == 1:
            for kwargs in layouts:
                _layout(t, **kwargs)
    return t


def test_a_batch_first_input_is_a_warning_at_the_construction():
    f = only(_trace({}), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 8
    assert "(32, 12, ...)" in f.message and "DataLoader batch" in f.message
    assert "steps through the 32 samples" in f.message
    assert [r.location.line for r in f.related] == [13]
    assert f.evidence == {"module": "LSTM", "name": None, "shape": [32, 12], "batch": 32,
                          "source": "loader"}


def test_attention_says_it_mixes_samples_and_the_loss_target_is_named():
    f = only(_trace({"cls": "MultiheadAttention", "source": "loss_target"}), SLUG)
    assert "Attention mixes the 32 samples" in f.message
    assert "batch size of the loss target" in f.message


def test_silent_without_a_batch_first_input_and_when_seen_both_ways():
    assert findings(_trace(), SLUG) == []
    assert findings(_trace({"layout": "seq_first", "shape": (12, 32)}), SLUG) == []
    assert findings(_trace({}, {"layout": "seq_first", "shape": (12, 32)}), SLUG) == []


def test_sites_are_judged_apart():
    both = _trace({}, {"layout": "seq_first", "shape": (12, 32), "line": 9,
                       "cls": "TransformerEncoderLayer"})
    assert [f.location.line for f in findings(both, SLUG)] == [8]
    two = _trace({}, {"line": 9, "cls": "TransformerEncoderLayer"})
    assert [f.location.line for f in findings(two, SLUG)] == [8, 9]


def test_the_fix_names_the_attribute_the_constructor_and_the_input(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    f = only(_trace({}, path=str(script)), SLUG)
    assert f.message.startswith("`self.rnn` is built with batch_first=False")
    assert "`self.rnn = nn.LSTM(..., batch_first=True)`" in f.fix
    assert "`x.transpose(0, 1)`" in f.fix
    layer = only(_trace({"line": 9, "cls": "TransformerEncoderLayer", "call": 14},
                        path=str(script)), SLUG)
    assert "`layer = nn.TransformerEncoderLayer(..., batch_first=True)`" in layer.fix
    assert "takes it from its layer" in layer.fix
    assert "`.transpose(0, 1)`" in layer.fix  # the call names the encoder, not the layer


def _watch(script) -> list[tuple]:
    """The ``batch_layout`` events (site line offset, layout, shape, batch, source) of ``script``
    run under the instrumentation."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        first = script()
    return [(e.loc.line - first, e["cls"], e["layout"], e["shape"], e["batch"], e["source"])
            for e in rec.trace.of_kind("batch_layout")] + \
        [("error", e["where"], e["error"]) for e in rec.trace.of_kind("internal_error")]


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_the_watcher_tells_batch_first_from_seq_first_input_by_the_loader_batch():
    def script():
        first = _line()
        bad = nn.LSTM(6, 8)  # +1
        good = nn.GRU(6, 8)  # +2
        fine = nn.LSTM(6, 8, batch_first=True)  # +3: not watched
        attn = nn.MultiheadAttention(6, 2)  # +4
        loader = DataLoader(TensorDataset(torch.randn(40, 5, 6)), batch_size=8)
        for (x,) in loader:  # the last batch has 8 too: 40 = 5 * 8
            bad(x)
            good(x.transpose(0, 1))
            fine(x)
            attn(x.permute(1, 0, 2), x.permute(1, 0, 2), x.permute(1, 0, 2))
        return first

    assert _watch(script) == [(2, "GRU", "seq_first", [5, 8], 8, "loader"),
                              (4, "MultiheadAttention", "seq_first", [5, 8], 8, "loader"),
                              (1, "LSTM", "batch_first", [8, 5], 8, "loader")]


def test_the_watcher_reads_the_loss_target_unless_it_is_laid_out_like_the_input():
    def script():
        first = _line()
        rnn = nn.GRU(4, 4)  # +1: (batch, seq) against one label per sample
        tagger = nn.LSTM(4, 4)  # +2: (seq, 1) against one tag per word: silent
        auto = nn.GRU(4, 4)  # +3: (seq, batch) against a (seq, batch) target: silent
        for _ in range(3):
            out, _ = rnn(torch.randn(10, 7, 4))
            nn.functional.mse_loss(out[:, -1, :1], torch.randn(10, 1))
            out, _ = tagger(torch.randn(6, 1, 4))
            nn.functional.cross_entropy(out.view(6, 4), torch.randint(0, 4, (6,)))
            series = torch.randn(9, 3, 4)
            out, _ = auto(series)
            nn.functional.mse_loss(out, series)
        return first

    assert _watch(script) == [(1, "GRU", "batch_first", [10, 7], 10, "loss_target")]


def test_the_watcher_counts_a_partial_last_batch_and_transformer_clones_once():
    def script():
        first = _line()
        rnn = nn.LSTM(3, 3)  # +1: seq-first, its length equal to the batch size
        layer = nn.TransformerEncoderLayer(4, 1, 8, 0.0)  # +2
        encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        loader = DataLoader(TensorDataset(torch.randn(20, 3)), batch_size=8)
        for (x,) in loader:  # 8, 8, then 4
            rnn(x.expand(8, *x.shape))  # (8, batch, 3): (8, 8) either way, then (8, 4)
            encoder(torch.randn(len(x), 5, 4))  # batch-first: once per batch, not per clone
        return first

    events = _watch(script)
    assert events[0] == (2, "TransformerEncoderLayer", "batch_first", [8, 5], 8, "loader")
    assert (1, "LSTM", "seq_first", [8, 4], 4, "loader") in events
    assert not [e for e in events if e[:3] == (1, "LSTM", "batch_first")]


def test_the_watcher_leaves_the_module_and_its_results_as_torch_makes_them():
    torch.manual_seed(0)
    plain = nn.LSTM(3, 4)
    x = torch.randn(6, 5, 3)
    expected = plain(x)[0]
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        watched = nn.LSTM(3, 4)
        for _ in range(3):
            got = watched(x)[0]
            nn.functional.mse_loss(got[:, -1], torch.zeros(6, 4))
        torch.save(watched, io.BytesIO())  # nothing of graddoctor's on the module
        assert torch.equal(got, expected)
    assert nn.LSTM.forward.__module__ == "torch.nn.modules.rnn"  # restored on exit
    assert [e["layout"] for e in rec.trace.of_kind("batch_layout")] == ["batch_first"]
    assert not rec.trace.of_kind("internal_error")


def test_one_batch_is_one_look_however_many_clones_run_it():
    def script():
        first = _line()
        layer = nn.TransformerEncoderLayer(4, 1, 8, 0.0)  # +1
        encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        for (x,) in DataLoader(TensorDataset(torch.randn(6, 5, 4)), batch_size=6):
            encoder(x)  # three clones see (6, 5, 4): still one batch, not two
        return first

    assert _watch(script) == []


def test_a_transformer_is_one_site_not_its_layers_and_a_loader_made_in_the_loop_counts():
    def script():
        first = _line()
        model = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0)  # +1: its layers are its parts
        for _ in range(2):
            for src, tgt in DataLoader(TensorDataset(torch.randn(12, 5, 8), torch.randn(12, 5, 8)),
                                       batch_size=4):
                model(src=src, tgt=tgt)  # batch-first; the loader is gone after iter()
        return first

    assert _watch(script) == [(1, "Transformer", "batch_first", [4, 5], 4, "loader")]


def test_an_input_whose_both_dimensions_are_batch_sizes_is_no_evidence():
    def script():
        first = _line()
        rnn = nn.GRU(4, 4)  # +1
        head = nn.Linear(4, 1)
        for _ in range(3):
            for (x,) in DataLoader(TensorDataset(torch.randn(8, 5, 4)), batch_size=8):
                out, _ = rnn(x)  # dim 0 is the loader's 8, dim 1 the other loss's 5
                nn.functional.mse_loss(head(out[-1]), torch.zeros(5, 1))
        return first

    assert _watch(script) == []
