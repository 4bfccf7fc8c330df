"""token-stream-interleaved (GD314): a language model's token batches viewed out of a 1-D
stream along the wrong axis (batchify without the transpose), read from the embedding's saved
ids (a view of the stream) and the loss's saved targets at the first backwards."""

from __future__ import annotations

import textwrap

import torch
from torch import nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.streamaxis import StreamAxisWatcher, interleaved
from rule_traces import builder, findings, only

SLUG = "token-stream-interleaved"


def _stream(n=600, seed=0):
    torch.manual_seed(seed)
    return torch.randint(0, 40, (n,))


def test_batchify_without_the_transpose_is_found_seq_first():
    s = _stream()
    laid = s.view(-1, 6)  # (100, 6): each column every 6th token
    x, y = laid[0:8], laid[1:9].view(-1)
    assert interleaved(x, y) == (0, 6)


def test_rows_sliced_along_the_wrong_axis_and_batch_first_are_found():
    s = _stream()
    rows = s.view(6, -1)  # (6, 100), not transposed, sliced along its first axis
    assert interleaved(rows[0:4], rows[1:5].reshape(-1)) == (0, 100)
    cols = s.view(-1, 5).t()  # batch-first rows of every 5th token
    assert interleaved(cols[:, 0:10], cols[:, 1:11].reshape(-1)) == (1, 5)


def test_streams_read_in_order_stay_silent():
    s = _stream()
    copied = s.view(6, -1).t().contiguous()  # the recipe: a copy, no stream to read
    assert interleaved(copied[0:8], copied[1:9].reshape(-1)) is None
    viewed = s.view(6, -1).t()  # the same without the copy: the time axis steps by 1
    assert interleaved(viewed[0:8], viewed[1:9].reshape(-1)) is None
    rows = s.view(6, -1)  # batch-first rows sliced along their columns
    assert interleaved(rows[:, 0:10], rows[:, 1:11].reshape(-1)) is None
    windows = s[:590].unfold(0, 10, 10)
    assert interleaved(windows[:, :-1], windows[:, 1:].reshape(-1)) is None
    laid = s.view(-1, 6)
    assert interleaved(laid[0:8], (laid[0:8] % 3).reshape(-1)) is None  # tags, not next ids
    assert interleaved(laid[0:8], laid[0:8].reshape(-1)) is None  # no shift


def test_a_constant_stream_or_float_ids_are_not_judged():
    s = torch.zeros(600, dtype=torch.long)
    laid = s.view(-1, 6)
    assert interleaved(laid[0:8], laid[1:9].reshape(-1)) is None
    assert interleaved(laid[0:8].float(), laid[1:9].reshape(-1)) is None


def test_the_watcher_reports_once_with_the_embedding():
    events = []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
            pass

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def internal_error(self, where, exc):
            raise exc

        def retire(self, topic, subscriber):
            retired.append(subscriber)

    retired = []
    watcher = StreamAxisWatcher(_Rec())
    embed, rnn, head = nn.Embedding(40, 8), nn.GRU(8, 8), nn.Linear(8, 40)
    laid = _stream().view(-1, 6)
    for i in (0, 8, 16):
        out, _ = rnn(embed(laid[i:i + 8]))
        watcher.describe_loss(F.cross_entropy(head(out).view(-1, 40), laid[i + 1:i + 9].view(-1)))
    assert [made[0] for made in events] == ["stream_interleaved"]
    assert retired == [watcher.describe_loss]  # after its 3 windows: no call per step
    assert events[0][1]["axis"] == 0 and events[0][1]["stride"] == 6 and events[0][1]["shape"] == [8, 6]


SCRIPT = textwrap.dedent("""\
    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        data = data.narrow(0, 0, nbatch * bsz)
        return data.view(-1, bsz).contiguous()

    train_data = batchify(corpus, 8)
    for i in range(0, 100, 10):
        out = model(train_data[i:i + 10]).view(-1, V)
        loss = criterion(out, train_data[i + 1:i + 11].view(-1))
        loss.backward()
    """)


def _trace(params):
    t = builder(params=[0, 1])
    t.put(ev.stream_interleaved(shape=[10, 8], axis=0, stride=8, stream=800, params=list(params)),
          line=10)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=10)
    t.step(0, line=11)
    return t


def test_the_rule_warns_at_the_batchify_view(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    f = only(_trace([0]), SLUG)
    assert f.location.line == 4 and "8 tokens at a time" in f.message
    assert ".t().contiguous()" in f.fix


def test_the_rule_is_silent_when_nothing_trained_reads_the_ids():
    assert findings(_trace([7]), SLUG) == []
