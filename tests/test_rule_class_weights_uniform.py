"""class-weights-uniform (GD376): the ``uniform_weight`` aside the loss-input watcher records
(instrument/loss_inputs.py) and the rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "class-weights-uniform"


def _trace(**fields):
    t = builder(params=[0, 1])
    values = {"fn": "binary_cross_entropy_with_logits", "value": 9.0, "numel": 1, "classes": 1,
              "positives": 0.1, "pos_weight": False}
    values.update(fields)
    t.put(ev.uniform_weight(**values), 5)
    t.backward(fresh=[0, 1], line=6)
    t.step(line=7)
    return t


def test_a_binary_weight_meant_as_pos_weight_is_an_info():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.INFO
    assert "pos_weight" in f.message and "10 %" in f.message and "pos_weight=" in f.fix


def test_equal_class_weights_are_told_as_a_rescaled_loss():
    f = only(_trace(fn="cross_entropy", value=2.5, numel=4, classes=4, positives=None), SLUG)
    assert "all 2.5" in f.message and "4 classes" in f.message


def _recorded(loss_of, calls=3):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        lin = torch.nn.Linear(6, 3)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        for _ in range(calls):
            x = torch.randn(64, 6)
            opt.zero_grad()
            loss_of(lin(x)).backward()
            opt.step()
    return rec.trace.of_kind("uniform_weight")


def test_the_watcher_reads_a_constant_weight_and_nothing_else():
    rare = lambda: (torch.rand(64, 3) < 0.1).float()  # noqa: E731
    told = _recorded(lambda z: F.binary_cross_entropy_with_logits(z, rare(), weight=torch.tensor(8.0)))
    assert len(told) == 1 and told[0]["value"] == 8.0 and told[0]["positives"] < 0.5
    # pos_weight, a varying weight, a weight of 1, a scale beside pos_weight, common positives
    assert not _recorded(lambda z: F.binary_cross_entropy_with_logits(z, rare(), pos_weight=torch.tensor(8.0)))
    assert not _recorded(lambda z: F.binary_cross_entropy_with_logits(z, rare(), weight=torch.rand(64, 3)))
    assert not _recorded(lambda z: F.binary_cross_entropy_with_logits(z, rare(), weight=torch.ones(3)))
    assert not _recorded(lambda z: F.binary_cross_entropy_with_logits(
        z, rare(), weight=torch.tensor(2.0), pos_weight=torch.full((3,), 8.0)))
    assert not _recorded(lambda z: F.binary_cross_entropy_with_logits(
        z, (torch.rand(64, 3) < 0.7).float(), weight=torch.tensor(3.0)))
    y = lambda: torch.randint(0, 3, (64,))  # noqa: E731
    told = _recorded(lambda z: F.cross_entropy(z, y(), weight=torch.full((3,), 2.5)))
    assert len(told) == 1 and told[0]["classes"] == 3
    assert not _recorded(lambda z: F.cross_entropy(z, y(), weight=torch.tensor([1.0, 2.0, 3.0])))
    assert not _recorded(lambda z: F.cross_entropy(z, y(), weight=torch.ones(3)))
    assert not _recorded(lambda z: F.cross_entropy(z, y(), weight=torch.full((3,), 2.5)), calls=1)
