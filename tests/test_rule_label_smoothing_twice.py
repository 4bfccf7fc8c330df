"""label-smoothing-twice (GD255): the loss-input watcher's ``label_smoothing`` events over
cross_entropy's probability targets (instrument/loss_inputs.py), and the rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "label-smoothing-twice"
C = 6


def _events(target_of, smoothing=0.1, classes=C, module=False):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        logits = torch.randn(8, classes, requires_grad=True)
        y = torch.randint(0, classes, (8,))
        target = target_of(y, classes)
        if module:
            loss = nn.CrossEntropyLoss(label_smoothing=smoothing)(logits, target)
        else:
            loss = F.cross_entropy(logits, target, label_smoothing=smoothing)
        loss.backward()
    return [(e["label_smoothing"], e["classes"], e["target_smoothing"])
            for e in rec.trace.of_kind("label_smoothing")]


def smoothed(y, c, eps=0.1):
    return F.one_hot(y, c).float() * (1 - eps) + eps / c


def test_smoothed_targets_given_to_a_smoothing_loss_are_recorded():
    assert _events(smoothed) == [(0.1, C, 0.1)]
    assert _events(smoothed, module=True) == [(0.1, C, 0.1)]


def test_a_mixup_of_smoothed_rows_is_recorded():
    perm = torch.arange(8).flip(0)
    assert len(_events(lambda y, c: 0.6 * smoothed(y, c) + 0.4 * smoothed(y[perm], c))) == 1


def test_smoothing_once_records_nothing():
    assert _events(lambda y, c: y) == []  # class indices
    assert _events(smoothed, smoothing=0.0) == []  # no label_smoothing
    assert _events(lambda y, c: F.one_hot(y, c).float()) == []  # one-hot rows
    assert _events(lambda y, c: torch.randn(8, c).softmax(1)) == []  # a teacher's softmax
    assert _events(smoothed, classes=2) == []  # two classes: a soft label like any other


def test_the_rule_reports_at_the_loss_call():
    t = builder()
    t.put(ev.label_smoothing(label_smoothing=0.1, classes=10, floor=0.01, target_smoothing=0.1), 23)
    f = only(t, SLUG)
    assert f.location.line == 23 and "smoothed twice" in f.message and "label_smoothing=0.1" in f.message
    assert findings(builder(), SLUG) == []
