"""recurrent-state-across-shuffled-batches (GD169): hand-written traces, and the
``state_carried`` events the state-carry watcher (instrument/statecarry.py) records."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              SequentialSampler, TensorDataset)
from torch.utils.data.distributed import DistributedSampler

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument import statecarry
from graddoctor.instrument.dataloader import _random_sampler
from rule_traces import P, builder, findings, only

SLUG = "recurrent-state-across-shuffled-batches"


def _carried(t, line=17, shared="storage", call=None):
    t.put(ev.state_carried(cls="GRU", loader=0, sampler="RandomSampler", batch=[0, 1],
                           previous=[0, 0], rows=8, shared=shared, call=call), line=line)


def _trace(*carried, path="train.py"):
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=20)
        t.step(line=21)
        if i == 0:
            for kwargs in carried:
                _carried(t, **kwargs)
    return t


def test_a_carried_state_is_a_warning_at_the_line_that_feeds_it_back():
    f = only(_trace({}), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 17
    assert "starts batch 1 of epoch 0 from a view of the state it returned for batch 0" in f.message
    assert "(RandomSampler)" in f.message and "of 8" in f.message
    assert f.related == ()
    assert f.evidence == {"module": "GRU", "loader": 0, "sampler": "RandomSampler", "batch": [0, 1],
                          "previous_batch": [0, 0], "rows": 8, "shared": "storage"}


def test_a_copy_is_named_and_the_module_call_is_related_when_elsewhere():
    f = only(_trace({"shared": "values", "call": ["train.py", 9, "forward"]}), SLUG)
    assert "from a copy of the state" in f.message
    assert [r.location.line for r in f.related] == [9]


def test_one_finding_per_line_and_silent_without_events():
    assert findings(_trace(), SLUG) == []
    assert len(findings(_trace({}, {}), SLUG)) == 1
    assert len(findings(_trace({}, {"line": 30}), SLUG)) == 2


def test_the_fix_names_the_state_the_line_passes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("\n" * 15 + "def forward(self, tokens):\n"
                      + "    out, self.hidden = self.gru(self.emb(tokens), self.hidden)\n"
                      + "\n" * 11 + "def unroll(cell, x, h, c):\n"
                      + "    h, c = cell(x[:, 0], (h, c))\n")
    trace = _trace({}, {"line": 30}, path=str(script))
    by_line = {f.location.line: f.fix for f in findings(trace, SLUG)}
    assert by_line[17].startswith("reset `self.hidden` at the start of each batch")
    assert by_line[30].startswith("reset `h, c` at the start of each batch")


# -- the watcher ---------------------------------------------------------------------------------
def _loader(sampler=None, shuffle=True, rows=40, batch=8):
    data = TensorDataset(torch.randn(rows, 5, 3), torch.randn(rows, 1))
    if sampler == "batch_sampler":
        return DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), batch, True))
    return DataLoader(data, batch_size=batch, shuffle=shuffle, drop_last=True)


def _events(train, **loader) -> list[tuple]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        train(_loader(**loader))
    return [(e["cls"], e["shared"], e["batch"], e["previous"], e["rows"])
            for e in rec.trace.of_kind("state_carried")]


def _gru_loop(carry, steps=4, fresh_every_batch=False, eval_mode=False):
    def train(loader):
        gru, head = nn.GRU(3, 6, batch_first=True), nn.Linear(6, 1)
        opt = torch.optim.SGD([*gru.parameters(), *head.parameters()], lr=0.01)
        gru.train(not eval_mode)
        h = None
        for i, (x, y) in enumerate(loader):
            if i >= steps:
                break
            if fresh_every_batch:
                h = torch.zeros(1, x.size(0), 6)
            out, h = gru(x, h)
            h = carry(h)
            loss = nn.functional.mse_loss(head(out[:, -1]), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return train


def test_the_watcher_finds_a_state_carried_across_shuffled_batches():
    assert _events(_gru_loop(lambda h: h.detach())) == [("GRU", "storage", [0, 1], [0, 0], 8)]
    assert _events(_gru_loop(lambda h: h.data)) == [("GRU", "storage", [0, 1], [0, 0], 8)]
    assert _events(_gru_loop(lambda h: h.detach().clone())) == [("GRU", "values", [0, 1], [0, 0], 8)]
    assert _events(_gru_loop(lambda h: h.detach()), sampler="batch_sampler") \
        == [("GRU", "storage", [0, 1], [0, 0], 8)]


def test_the_watcher_is_silent_on_batches_served_in_order_and_fresh_states():
    assert _events(_gru_loop(lambda h: h.detach()), shuffle=False) == []
    assert _events(_gru_loop(lambda h: h.detach(), fresh_every_batch=True)) == []
    assert _events(_gru_loop(lambda h: None)) == []
    assert _events(_gru_loop(lambda h: h.detach(), eval_mode=True)) == []


def test_a_state_reset_in_place_is_not_carried():
    assert _events(_gru_loop(lambda h: h.detach().zero_())) == []  # its version moved
    assert _events(_gru_loop(lambda h: h.data.fill_(0.0))) == []  # no version moved: all one value
    assert _events(_gru_loop(lambda h: h.detach().mul_(0.5))) == []  # changed in place: not judged


def test_a_cell_unrolled_within_each_batch_is_judged_at_the_next_batch_only():
    def train(reset):
        def run(loader):
            cell, head = nn.LSTMCell(3, 6), nn.Linear(6, 1)
            opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
            state = None
            for i, (x, y) in enumerate(loader):
                if i >= 3:
                    break
                if reset:
                    state = None
                for t in range(x.size(1)):
                    state = cell(x[:, t], state)
                loss = nn.functional.mse_loss(head(state[0]), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                state = tuple(s.detach() for s in state)
        return run

    assert _events(train(reset=False)) == [("LSTMCell", "storage", [0, 1], [0, 0], 8)]
    assert _events(train(reset=True)) == []


def test_a_state_whose_rows_are_not_the_batch_samples_is_not_judged():
    def train(loader):
        gru = nn.GRU(3, 6)
        opt = torch.optim.SGD(gru.parameters(), lr=0.01)
        stream = torch.randn(40, 7, 3)  # (time, 7 rows, 3): contiguous chunks, a batch of 7
        h = None
        for i, (x, _) in enumerate(loader):  # another shuffled loader read alongside
            out, h = gru(stream[i * 5:(i + 1) * 5], h)
            h = h.detach()
            loss = out.pow(2).mean() + x.sum() * 0
            opt.zero_grad()
            loss.backward()
            opt.step()

    assert _events(train) == []


def test_the_window_closes_after_the_first_backwards(monkeypatch):
    monkeypatch.setattr(statecarry, "WINDOW", 2)

    def train(loader):
        gru = nn.GRU(3, 6, batch_first=True)
        opt = torch.optim.SGD(gru.parameters(), lr=0.01)
        h = None
        for i, (x, _) in enumerate(loader):
            out, h = gru(x, h if i >= 3 else None)  # carried from the 4th batch on: too late
            h = h.detach()
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    assert _events(train) == []


def test_which_samplers_draw_at_random():
    data = TensorDataset(torch.randn(10, 2))
    assert _random_sampler(DataLoader(data, shuffle=True)) == "RandomSampler"
    assert _random_sampler(DataLoader(data, shuffle=False)) is None
    assert _random_sampler(DataLoader(data, sampler=SequentialSampler(data))) is None
    assert _random_sampler(DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 2, False))) \
        == "RandomSampler"
    assert _random_sampler(DataLoader(data, batch_size=None, shuffle=True)) == "RandomSampler"
    assert _random_sampler(DataLoader(data, batch_sampler=[[0, 1], [2, 3]])) is None  # the script's own
    shuffled = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
    assert _random_sampler(DataLoader(data, sampler=shuffled)) == "DistributedSampler"
    ordered = DistributedSampler(data, num_replicas=2, rank=0, shuffle=False)
    assert _random_sampler(DataLoader(data, sampler=ordered)) is None

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    assert _random_sampler(DataLoader(Stream())) is None
