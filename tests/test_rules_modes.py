"""The train/eval-mode rules on hand-written traces (no torch)."""

from __future__ import annotations

import pytest

from graddoctor.rules.eval_in_train_mode import EvalInTrainMode
from graddoctor.rules.frozen_bn_train_mode import FrozenBnTrainMode
from graddoctor.rules.train_in_eval_mode import TrainInEvalMode
from mode_traces import bn, check, end, fwd, mode_set, new, update


RULES = (FrozenBnTrainMode, TrainInEvalMode, EvalInTrainMode)


def test_teacher_in_eval_under_no_grad_is_silent():
    t = new()
    mode_set(t, False, [0], line=3)  # teacher.eval()
    bn(t, 0, frozen=False, owned=False)
    bn(t, 1)
    mode_set(t, True, [1], line=4)  # student.train()
    fwd(t, [0], line=6, training=False, grad=False)
    fwd(t, [1], line=7)
    update(t, line=8)
    end(t)
    assert check(TrainInEvalMode, t) == []
    assert check(EvalInTrainMode, t) == []
    assert check(FrozenBnTrainMode, t) == []


def test_no_mode_events_no_findings():
    t = new()
    mode_set(t, False, [], line=3)  # a model without BatchNorm or dropout
    update(t, line=4)
    end(t)
    for rule in RULES:
        assert check(rule, t) == []


@pytest.mark.parametrize("rule", RULES)
def test_rule_docs_have_the_four_sections(rule):
    for title in ("What it does", "Why is this bad?", "Example", "Use instead"):
        assert rule.doc_section(title), f"{rule.slug}: missing '{title}'"
    assert rule.code.startswith("GD3") and rule.fix and rule.summary
