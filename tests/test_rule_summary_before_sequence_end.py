"""summary-before-sequence-end (GD149): the ``causal_read_early`` event of
instrument/causalread.py for a causal sequence module's output read by the loss only at early
positions, the helpers it judges with, and the rule's finding and its line."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.source import output_read_line
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.causalread import causal_mask, short_direction, unread_positions
from rule_traces import builder, findings, only

SLUG = "summary-before-sequence-end"


def _event(**over):
    data = dict(module="GRU", positions=[0], read=1, length=12, unread=11, rows=16, seq_first=False)
    data.update(over)
    return ev.causal_read_early(**data)


def test_the_event_is_a_warning_at_the_call_when_the_source_names_no_read():
    t = builder()
    t.put(_event(), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert f.evidence == {"module": "GRU", "positions": [0], "length": 12, "unread_positions": 11,
                          "rows": 16}
    assert "one-direction GRU" in f.message and "first position only" in f.message
    assert "out[:, -1]" in f.fix and findings(builder(), SLUG) == []


def test_the_finding_moves_to_the_line_that_indexes_the_output(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        def forward(self, x):
            out, (h, c) = self.lstm(x)
            y = self.fc(out[0])
            return y
        """))
    t = builder()
    t.path = str(script)
    t.put(_event(module="LSTM", seq_first=True), 2)
    f = only(t, SLUG)
    assert f.location.line == 3 and "`out[0]`" in f.message and "out[-1]" in f.fix
    t = builder()
    t.path = str(script)
    t.put(_event(module="TransformerEncoder", positions=[3], length=6, unread=2), 2)
    f = only(t, SLUG)  # no read of position 3 along dim 1 is written: the call's line
    assert f.location.line == 2 and "causal Transformer" in f.message


def test_output_read_line_reads_subscripts_select_narrow_and_slices(tmp_path):
    script = tmp_path / "m.py"
    script.write_text(textwrap.dedent("""\
        def f(self, x):
            h = self.enc(x)
            a = h[:, 1]
            b = h.select(1, 0)
            return a, b

        def g(self, x):
            seq, _ = self.rnn(x)
            return seq[:, :4].mean(1), seq[:, -1]

        def k(self, x):
            return self.rnn(x)[0][:, 5]
        """))
    path = str(script)
    assert output_read_line(path, 2, 1, 0, 8) == (4, "h.select(1, 0)")
    assert output_read_line(path, 2, 1, 1, 8) == (3, "h[:, 1]")
    assert output_read_line(path, 2, 0, 1, 8) is None  # another dimension
    assert output_read_line(path, 8, 1, 3, 16) == (9, "seq[:, :4]")
    assert output_read_line(path, 8, 1, 15, 16) == (9, "seq[:, -1]")
    assert output_read_line(path, 12, 1, 5, 20) == (12, "self.rnn(x)[0][:, 5]")


def test_unread_positions():
    filled = torch.ones(6, dtype=torch.bool)
    first = torch.zeros(4, 6, 1, dtype=torch.bool)
    first[:, 0] = True
    assert unread_positions(first, (True,), filled) == ([0], [1, 2, 3, 4, 5])
    last = torch.zeros(4, 6, 1, dtype=torch.bool)
    last[:, -1] = True
    assert unread_positions(last, (True,), filled) is None
    varies = torch.zeros(4, 6, 1, dtype=torch.bool)
    varies[torch.arange(4), torch.tensor([2, 5, 3, 1])] = True  # each row's last real step
    assert unread_positions(varies, (True,), filled) is None
    both = torch.zeros(4, 6, 2, dtype=torch.bool)
    both[:, 0] = True  # a bidirectional layer's step 0: its backward half has read it all
    assert unread_positions(both, (True, False), filled) is None
    only_forward = both.clone()
    only_forward[:, :, 1] = False
    assert unread_positions(only_forward, (True, False), filled) == ([0], [1, 2, 3, 4, 5])
    padding = torch.tensor([True, True, True, False, False, False])  # the same in every row
    at_two = torch.zeros(4, 6, 1, dtype=torch.bool)
    at_two[:, 2] = True
    assert unread_positions(at_two, (True,), padding) is None
    assert unread_positions(at_two, (True,), filled) == ([2], [3, 4, 5])
    all_but_last = torch.ones(4, 6, 1, dtype=torch.bool)
    all_but_last[:, -1] = False  # a loss at every step whose next token exists
    assert unread_positions(all_but_last, (True,), filled) is None
    prefix = torch.zeros(4, 6, 1, dtype=torch.bool)
    prefix[:, :2] = True
    assert unread_positions(prefix, (True,), filled) == ([0, 1], [2, 3, 4, 5])
    one_row = prefix[:1]  # one row: a pooling cannot be told from a read of a prefix
    assert unread_positions(one_row, (True,), filled) is None
    assert unread_positions(torch.zeros(4, 6, 1, dtype=torch.bool), (True,), filled) is None


def test_causal_mask():
    assert causal_mask(nn.Transformer.generate_square_subsequent_mask(5))
    assert causal_mask(torch.ones(5, 5, dtype=torch.bool).triu(1))
    assert causal_mask(torch.ones(5, 5, dtype=torch.bool).triu(1).expand(8, 5, 5))
    assert not causal_mask(torch.ones(5, 5, dtype=torch.bool).tril(-1))  # the future seen
    assert not causal_mask(torch.zeros(5, 5))
    assert not causal_mask(torch.zeros(4, 5, dtype=torch.bool))  # a padding mask
    assert not causal_mask(None)


def _events(make, read, steps=2) -> list[tuple]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model, width = make()
        head = nn.Linear(width, 2)
        opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
        for _ in range(steps):
            x = torch.randn(8, 10, 8)
            loss = nn.functional.cross_entropy(head(read(model, x)), torch.randint(0, 2, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["module"], e["positions"], e["unread"]) for e in rec.trace.of_kind("causal_read_early")]


def _gru(bidirectional=False):
    return lambda: (nn.GRU(8, 8, batch_first=True, bidirectional=bidirectional), 16 if bidirectional else 8)


def _encoder():
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2), 8


def test_the_watcher_finds_an_early_read_of_a_causal_module():
    assert _events(_gru(), lambda m, x: m(x)[0][:, 0]) == [("GRU", [0], 9)]
    assert _events(_gru(), lambda m, x: m(x.transpose(0, 1).contiguous())[0][3]) == []  # batch_first
    mask = nn.Transformer.generate_square_subsequent_mask(10)
    assert _events(_encoder, lambda m, x: m(x, mask=mask)[:, 0]) == [("TransformerEncoder", [0], 9)]
    assert _events(_encoder, lambda m, x: m(x, mask=mask, is_causal=True)[:, 4]) \
        == [("TransformerEncoder", [4], 5)]


def test_the_watcher_is_silent_on_reads_that_have_seen_the_sequence():
    assert _events(_gru(), lambda m, x: m(x)[0][:, -1]) == []
    assert _events(_gru(), lambda m, x: m(x)[1][-1]) == []
    assert _events(_gru(), lambda m, x: m(x)[0].mean(1)) == []
    assert _events(_gru(True), lambda m, x: m(x)[0][:, 0]) == []
    assert _events(_encoder, lambda m, x: m(x)[:, 0]) == []  # no causal mask: CLS pooling
    ends = lambda m, x: torch.cat([m(x)[0][:, -1, :8], m(x)[0][:, 0, 8:]], 1)  # noqa: E731
    assert _events(_gru(True), ends) == []
    assert _events(_gru(True), lambda m, x: torch.cat([m(x)[1][-2], m(x)[1][-1]], 1)) == []


def test_positions_the_calls_key_padding_mask_hides_in_every_row_are_padding():
    # a read of positions 0..2 of 10: the 7 positions after them hold data (the input differs
    # between rows everywhere), unless the call's own key padding mask hides them in every row
    mask = nn.Transformer.generate_square_subsequent_mask(10)
    tail = torch.zeros(8, 10, dtype=torch.bool)
    tail[:, 3:] = True
    read = lambda m, x, **kw: m(x, mask=mask, **kw)[:, :3].mean(1)  # noqa: E731
    assert _events(_encoder, read) == [("TransformerEncoder", [0, 1, 2], 7)]
    assert _events(_encoder, lambda m, x: read(m, x, src_key_padding_mask=tail)) == []
    float_tail = torch.zeros(8, 10).masked_fill(tail, float("-inf"))
    assert _events(_encoder, lambda m, x: read(m, x, src_key_padding_mask=float_tail)) == []
    # a mask that hides the tail of some rows only leaves those positions data
    some = tail.clone()
    some[:4] = False
    assert _events(_encoder, lambda m, x: read(m, x, src_key_padding_mask=some)) \
        == [("TransformerEncoder", [0, 1, 2], 7)]


def test_the_watcher_finds_a_bidirectional_output_read_at_its_last_step():
    assert _events(_gru(True), lambda m, x: m(x)[0][:, -1]) == [("GRU", [9], 9)]


def test_short_direction():
    filled = torch.ones(6, dtype=torch.bool)
    last = torch.zeros(4, 6, 2, dtype=torch.bool)
    last[:, -1] = True  # out[:, -1]: the backward half has seen position 5 alone
    assert short_direction(last, (True, False), filled) == (1, [5], [0, 1, 2, 3, 4])
    first = torch.zeros(4, 6, 2, dtype=torch.bool)
    first[:, 0] = True  # out[:, 0]: kept as a first-step summary
    assert short_direction(first, (True, False), filled) is None
    ends = torch.zeros(4, 6, 2, dtype=torch.bool)
    ends[:, -1, 0] = True
    ends[:, 0, 1] = True
    assert short_direction(ends, (True, False), filled) is None
    varies = torch.zeros(4, 6, 2, dtype=torch.bool)
    varies[torch.arange(4), torch.tensor([2, 5, 3, 1])] = True  # each row's own last step
    assert short_direction(varies, (True, False), filled) is None
    padded = torch.tensor([True, True, True, True, False, False])
    late = torch.zeros(4, 6, 2, dtype=torch.bool)
    late[:, 3] = True
    assert short_direction(late, (True, False), padded) == (1, [3], [0, 1, 2])
    assert short_direction(last[:, :, :1], (True,), filled) is None


def test_a_bidirectional_event_names_the_short_direction():
    t = builder()
    t.put(_event(module="LSTM", positions=[11], read=1, unread=11, direction="backward"), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and "bidirectional LSTM" in f.message
    assert "backward direction" in f.message and "the last position only" in f.message
    assert "h_n[-2]" in f.fix and f.evidence["direction"] == "backward"


class _Stack(nn.Module):
    """``first`` (a module) then a one-direction GRU, or causal encoder layers called in turn."""

    def __init__(self, first=None, layers=0):
        super().__init__()
        self.first = first
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
                                    for _ in range(layers))

    def forward(self, x):
        if self.layers:
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            for layer in self.layers:
                x = layer(x, src_mask=mask)
            return x
        if isinstance(self.first, nn.RNNBase):
            x = self.first(x)[0]
        elif self.first is not None:
            x = self.first(x)
        return self.gru(x)[0]


def test_a_causal_module_over_positions_mixed_both_ways_is_not_judged():
    bidirectional = lambda: (_Stack(nn.LSTM(8, 4, batch_first=True, bidirectional=True)), 8)  # noqa: E731
    encoder = lambda: (_Stack(_encoder()[0]), 8)  # noqa: E731
    conv = lambda: (_Stack(nn.Sequential(Transpose(), nn.Conv1d(8, 8, 3, padding=1), Transpose())), 8)  # noqa: E731
    for make in (bidirectional, encoder, conv):
        assert _events(make, lambda m, x: m(x)[:, 0]) == []
    forward_first = lambda: (_Stack(nn.LSTM(8, 8, batch_first=True)), 8)  # noqa: E731
    assert _events(forward_first, lambda m, x: m(x)[:, 0]) == [("GRU", [0], 9)]
    layers = lambda: (_Stack(layers=2), 8)  # noqa: E731
    assert _events(layers, lambda m, x: m(x)[:, 0]) == [("TransformerEncoderLayer", [0], 9)]


class Transpose(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def test_a_position_drawn_for_each_batch_is_a_design_and_one_read_is_not_enough():
    draws = iter([3, 7, 3, 5])
    assert _events(_gru(), lambda m, x: m(x)[0][:, next(draws)], steps=4) == []  # CPC's context
    assert _events(_gru(), lambda m, x: m(x)[0][:, 0], steps=1) == []
    assert _events(_gru(), lambda m, x: m(x)[0][:, 2], steps=3) == [("GRU", [2], 7)]


def test_an_early_step_read_with_the_final_hidden_state_is_a_whole_read():
    def both(m, x):
        out, h = m(x)
        return torch.cat([out[:, 0], h[-1]], 1)

    def cell(m, x):
        out, (h, c) = m(x)
        return torch.cat([out[:, 0], c[-1]], 1)

    assert _events(lambda: (nn.GRU(8, 8, batch_first=True), 16), both) == []
    assert _events(lambda: (nn.LSTM(8, 8, batch_first=True), 16), cell) == []
    assert _events(lambda: (nn.GRU(8, 8, batch_first=True), 16),
                   lambda m, x: torch.cat([m(x)[0][:, 0], m(x)[1][-1]], 1)) == [("GRU", [0], 9)]


class _Blocks(nn.Module):
    """Blocks of causal self-attention with residuals, written by hand around MultiheadAttention."""

    def __init__(self, causal=True):
        super().__init__()
        self.causal = causal
        self.attn = nn.ModuleList(nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        for attn in self.attn:
            x = x + attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return x


def test_hand_written_causal_attention_blocks():
    assert _events(lambda: (_Blocks(), 8), lambda m, x: m(x)[:, 0]) == [("MultiheadAttention", [0], 9)]
    assert _events(lambda: (_Blocks(), 8), lambda m, x: m(x)[:, -1]) == []
    assert _events(lambda: (_Blocks(causal=False), 8), lambda m, x: m(x)[:, 0]) == []


class _CellLoop(nn.Module):
    """An RNNCell unrolled by hand; its states stacked batch-first (or time-first)."""

    def __init__(self, time_first=False, backward=False):
        super().__init__()
        self.cell, self.time_first, self.backward = nn.RNNCell(8, 8), time_first, backward

    def forward(self, x):
        h = torch.zeros(x.shape[0], 8) + 0.1
        steps = range(x.shape[1])
        states = [None] * x.shape[1]
        for t in (reversed(steps) if self.backward else steps):
            h = self.cell(x[:, t], h)
            states[t] = h
        return torch.stack(states, 0 if self.time_first else 1)


def test_the_watcher_finds_an_early_read_of_stacked_recurrent_states():
    loop = lambda **kw: lambda: (_CellLoop(**kw), 8)  # noqa: E731
    assert _events(loop(), lambda m, x: m(x)[:, 0]) == [("torch.stack", [0], 9)]
    assert _events(loop(time_first=True), lambda m, x: m(x)[0]) == [("torch.stack", [0], 9)]
    assert _events(loop(), lambda m, x: m(x)[:, 2]) == [("torch.stack", [2], 7)]
    # the last step, the mean over time, a backward recurrence read at its own end: seen it all
    assert _events(loop(), lambda m, x: m(x)[:, -1]) == []
    assert _events(loop(time_first=True), lambda m, x: m(x).mean(0)) == []
    assert _events(loop(backward=True), lambda m, x: m(x)[:, 0]) == []
    assert _events(loop(), lambda m, x: m(x).flatten(1)[:, :8]) == [("torch.stack", [0], 9)]


def test_forward_recurrence_needs_each_step_built_on_the_one_before():
    from graddoctor.instrument.causalread import forward_recurrence

    w = torch.randn(4, 4, requires_grad=True)
    h, chain = torch.zeros(2, 4), []
    for _ in range(4):
        h = torch.tanh(h @ w + 1)
        chain.append(h)
    assert forward_recurrence(chain)
    assert not forward_recurrence(chain[::-1])  # a backward recurrence in time order
    x = torch.randn(4, 2, 4)
    independent = [torch.tanh(x[t] @ w) for t in range(4)]  # per-step projections
    assert not forward_recurrence(independent)
    assert not forward_recurrence([chain[0]] * 3)  # one tensor stacked again
    assert not forward_recurrence([c.detach() for c in chain])


def test_the_stack_wrapper_is_put_back_after_the_window():
    original = torch.stack
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        assert torch.stack is not original
        lin = nn.Linear(2, 1)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        for _ in range(12):
            loss = lin(torch.randn(4, 2)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert torch.stack is original
    assert torch.stack is original
