"""loss-counts-padding (GD235): hand-written traces, and the loss watcher in-process over an
embedding with a padding_idx."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "loss-counts-padding"


def test_padding_not_ignored_is_a_warning_with_the_pad_in_the_fix():
    t = TraceBuilder()
    t.put(ev.loss_padding(fn="cross_entropy", pad=0, fraction=0.7, ignore_index=-100,
                          reduction="mean"), 12)
    f = only(t, SLUG)
    assert f.location.line == 12 and "70%" in f.message and "ignore_index=0" in f.fix


def test_an_ignore_index_that_never_matches_is_named():
    t = TraceBuilder()
    t.put(ev.loss_padding(fn="nll_loss", pad=29, fraction=0.5, ignore_index=-1, reduction="sum"), 3)
    assert "ignore_index=-1 never matches" in only(t, SLUG).message


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


def padded_losses(**loss_kw):
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(10, 4, padding_idx=0), nn.Linear(4, 10)
    tokens = torch.zeros(4, 8, dtype=torch.long)
    tokens[:, :2] = torch.randint(1, 10, (4, 2))
    with Instrumentation(rec):
        logits = head(emb(tokens))
        F.cross_entropy(logits.reshape(-1, 10), tokens.reshape(-1), **loss_kw).sum().backward()
    return [e for e in rec.trace if e.kind == "loss_padding"]


def test_the_watcher_sees_mostly_padded_targets():
    (e,) = padded_losses()
    assert e.get("pad") == 0 and e.get("fraction") == 0.75


def test_the_watcher_is_silent_with_ignore_index_or_reduction_none():
    assert padded_losses(ignore_index=0) == []
    assert padded_losses(reduction="none") == []
