"""prefix-sum-off-positions (GD388): the ``cumulative_axis`` event of instrument/cumorder.py
joined with the dependency probe's sequence length, and the rule's finding at the op."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "prefix-sum-off-positions"


def _axes(dim, probs=False) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        emb, head = nn.Embedding(10, 6), nn.Linear(6, 10)
        opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.01)
        for _ in range(2):
            ids = torch.randint(0, 10, (4, 9))
            x = emb(ids[:, :-1])
            h = x.softmax(-1) if probs else x
            loss = F.cross_entropy(head(h.cumsum(dim=dim)).reshape(-1, 10), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("cumulative_axis")]


def test_the_watcher_records_the_axis_of_each_prefix_once_per_line():
    assert _axes(2) == [{"op": "cumsum", "shape": [4, 8, 6], "dim": 2, "cdf": False}]
    assert _axes(-2) == [{"op": "cumsum", "shape": [4, 8, 6], "dim": 1, "cdf": False}]
    assert _axes(-1, probs=True)[0]["cdf"] is True  # a distribution's CDF over its classes


def _trace(shape, dim, k=1, positions=31, cdf=False):
    t = builder()
    seq = {"k": k, "positions": positions, "t": 15, "future": False, "past": True}
    t.put(ev.dependency(model="LM", batch=16, source=None, mixed=None, op=None, op_at=None,
                        seq=seq, modules=[], forward=None), 40)
    t.put(ev.cumulative_axis(op="cumsum", shape=shape, dim=dim, cdf=cdf), 33)
    return t


def test_a_prefix_over_the_heads_of_a_next_token_model_is_a_warning_at_the_op():
    f = only(_trace([16, 31, 4, 8, 8], 2), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 33
    assert "axis 2 (size 4)" in f.message and "cumsum(dim=1)" in f.fix
    assert f.evidence["positions_axis"] == 1


def test_silent_over_the_positions_without_next_token_targets_or_when_ambiguous():
    assert findings(_trace([16, 31, 4, 8, 8], 1), SLUG) == []
    assert findings(_trace([16, 31, 4, 8, 8], 2, k=0), SLUG) == []
    assert findings(_trace([16, 31, 31, 8], 3), SLUG) == []  # T at two axes
    assert findings(_trace([16, 4, 8, 8], 2), SLUG) == []  # chunked: no axis of T
    assert findings(_trace([16, 31, 50], 2, cdf=True), SLUG) == []  # a CDF over 50 classes
