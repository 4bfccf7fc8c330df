"""down-weighted-class-never-targeted (GD386): the ``weighted_class_absent`` event of
instrument/loss_inputs.py, the source lookup of the target's fill, and the rule on hand-written
traces."""

from __future__ import annotations

import ast
import textwrap

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.loss_inputs import weighted_class_absent
from graddoctor.rules.down_weighted_class_never_targeted import target_fill
from rule_traces import builder, findings, only

SLUG = "down-weighted-class-never-targeted"


def test_a_down_weighted_class_no_target_names_is_told():
    weights = torch.tensor([1.0, 1.0, 1.0, 0.1])
    found = weighted_class_absent(torch.tensor([200.0, 40.0, 30.0, 0.0]), weights)
    assert found["cls"] == 3 and found["weight"] == 0.1 and found["top"] == 0
    assert found["top_share"] == round(200 / 270, 4)
    # the class is a target: the weight is where it belongs
    assert weighted_class_absent(torch.tensor([40.0, 30.0, 10.0, 200.0]), weights) is None
    # weighted up, not down; several weights (inverse frequencies)
    assert weighted_class_absent(torch.tensor([200.0, 40.0, 30.0, 0.0]),
                                 torch.tensor([1.0, 1.0, 1.0, 5.0])) is None
    assert weighted_class_absent(torch.tensor([200.0, 40.0, 30.0, 0.0]),
                                 torch.tensor([0.3, 0.9, 1.4, 0.1])) is None


def test_the_fill_of_the_loss_target_is_found():
    src = textwrap.dedent("""
        def loss_labels(logits, labels, idx, weight):
            target_classes = torch.full(logits.shape[:2], 0, dtype=torch.int64)
            target_classes[idx] = labels
            return F.cross_entropy(logits.transpose(1, 2), target_classes, weight)
    """)
    assert target_fill(ast.parse(src), 5) == (3, "target_classes = torch.full(logits.shape[:2], 0, dtype=torch.int64)")
    other = src.replace("torch.full(logits.shape[:2], 0, dtype=torch.int64)", "make_targets(labels)")
    assert target_fill(ast.parse(other), 5) is None


def test_the_rule_reports_a_warning_at_the_loss_without_source():
    t = builder()
    t.put(ev.weighted_class_absent(fn="cross_entropy", cls=3, weight=0.1, others=1.0, targets=288,
                                   top=0, top_share=0.76), 14)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 14
    assert "class 3" in f.message and "class 3" in f.fix
    assert findings(builder(), SLUG) == []
