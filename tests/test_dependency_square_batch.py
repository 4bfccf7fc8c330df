"""target-visible-to-model (GD244) on square token batches: a (B, T) batch with T == B (16
sequences of a block of 16) left the dependency probe unable to tell the batch from the
positions, and it judged nothing. The sequence is judged there once the probed output row's
gradient stays in the same row of the embedded ids (dim 0 is the batch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.dependency import _rows_kept


class _LM(nn.Module):
    def __init__(self, causal: bool, batch_first: bool = True):
        super().__init__()
        self.causal, self.batch_first = causal, batch_first
        self.embed = nn.Embedding(30, 16)
        self.qkv = nn.Linear(16, 48)
        self.head = nn.Linear(16, 30)

    def forward(self, ids):
        x = self.embed(ids)
        if not self.batch_first:
            x = x.transpose(0, 1)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = self.head(x + F.scaled_dot_product_attention(q, k, v, is_causal=self.causal))
        return y if self.batch_first else y.transpose(0, 1)


def _seq_events(causal: bool, shift: int = 1, batch_first: bool = True, B: int = 9) -> list:
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _LM(causal, batch_first)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            ids = torch.randint(0, 30, (B, 10))
            x, y = (ids[:, :-1], ids[:, 1:]) if shift else (ids[:, :-1], ids[:, :-1])
            if not batch_first:
                x, y = x.t(), y.t()
            F.cross_entropy(model(x).reshape(-1, 30), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    assert not rec.trace.of_kind("internal_error")
    return [e["seq"] for e in rec.trace.of_kind("dependency")]


def test_square_batches_are_judged_like_any_other():
    (leaky,) = _seq_events(causal=False)
    assert (leaky["k"], leaky["future"], leaky["past"]) == (1, True, True)
    (causal,) = _seq_events(causal=True)
    assert (causal["k"], causal["future"]) == (1, False)
    (copying,) = _seq_events(causal=True, shift=0)
    assert (copying["k"], copying["future"]) == (0, False)


def test_a_square_sequence_first_batch_is_not_judged():
    # (T, B) ids with T == B given to a model that reads them sequence-first: the probed row
    # of the output reads a column of the ids, not a row: nothing is judged
    assert _seq_events(causal=False, batch_first=False) == []


def test_rows_kept_reads_the_batch_from_the_gradient():
    g = torch.zeros(4, 4, 3)
    g[1, :2] = 1.0
    assert _rows_kept(g, 1)
    g[2, 0] = 0.5
    assert not _rows_kept(g, 1)
    assert not _rows_kept(torch.zeros(4, 4, 3), 1)
    assert not _rows_kept(None, 1)
