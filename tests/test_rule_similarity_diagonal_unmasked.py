"""similarity-diagonal-unmasked (GD229): the loss-input watcher's self_match events over square
cross_entropy inputs, and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "similarity-diagonal-unmasked"


def _events(mask: bool = False, clip_labels: bool = False):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    z = F.normalize(torch.randn(8, 4), dim=1).requires_grad_()
    with Instrumentation(rec):
        logits = z @ z.T / 0.1
        if mask:
            logits = logits.masked_fill(torch.eye(8, dtype=torch.bool), float("-inf"))
        labels = torch.arange(8) if clip_labels else (torch.arange(8) + 4) % 8
        F.cross_entropy(logits, labels).backward()
    return [e for e in rec.trace if e.kind == "self_match"]


def test_a_similarity_matrix_with_its_diagonal_left_in_is_recorded():
    (e,) = _events()
    assert e["size"] == 8 and e["on_diagonal"] == 1.0


def test_a_masked_diagonal_or_labels_on_the_diagonal_record_nothing():
    assert _events(mask=True) == []
    assert _events(clip_labels=True) == []


def test_the_rule_reports_at_the_loss_call():
    t = builder()
    t.put(ev.self_match(size=32, on_diagonal=1.0), 14)
    f = only(t, SLUG)
    assert f.location.line == 14 and "32x32" in f.message and "masked_fill" in f.fix
    assert findings(builder(), SLUG) == []
