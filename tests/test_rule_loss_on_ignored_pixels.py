"""loss-on-ignored-pixels (GD267): the ``ignored_mask`` event of instrument/ignoredmask.py for a
soft-set term's probabilities masked to the pixels the cross-entropy ignores, the source lookup
of the comparison, and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from graddoctor.findings import Severity
from graddoctor.instrument.ignoredmask import selects_ignored
from graddoctor.options import CheckOptions
from graddoctor.rules.loss_on_ignored_pixels import ignored_comparisons
from graddoctor.run.session import run_check

SLUG = "loss-on-ignored-pixels"

SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
IGNORE = 255
net = nn.Conv2d(3, 3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    target = torch.randint(0, 3, (2, 8, 8))
    target[:, :2] = IGNORE
    logits = net(torch.randn(2, 3, 8, 8))
    mask = {mask}
    onehot = F.one_hot(target.clamp(max=2), 3).permute(0, 3, 1, 2).float()
    term = {term}
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE) + term
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
DICE = "1 - (2 * (logits.softmax(1) * mask * onehot).sum() + 1) / ((logits.softmax(1) * mask).sum() + (onehot * mask).sum() + 1)"


def _check(tmp_path, mask, term=DICE):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(mask=mask, term=term))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


@pytest.mark.parametrize("mask", [
    "(target == IGNORE).unsqueeze(1).float()",
    "target.eq(IGNORE)[:, None]",
])
def test_a_dice_term_masked_to_the_ignored_pixels_is_a_warning_at_the_comparison(tmp_path, mask):
    (f,) = _check(tmp_path, mask)
    assert f.severity is Severity.WARNING and f.location.line == 13
    assert f.evidence["ignore_index"] == 255 and f.evidence["ignored"] == 32
    assert f.related and f.related[0].location.line == 18  # the backward


@pytest.mark.parametrize("mask,term", [
    ("(target != IGNORE).unsqueeze(1).float()", DICE),
    ("1 - (target == IGNORE).unsqueeze(1).float()", DICE),
    ("(target < 3).unsqueeze(1)", DICE),
    # an entropy term meant for the unlabeled pixels goes through a log
    ("(target == IGNORE).unsqueeze(1).float()",
     "-(logits.softmax(1) * logits.log_softmax(1) * mask).sum() / mask.sum()"),
])
def test_masks_of_the_labeled_pixels_and_terms_through_a_log_stay_silent(tmp_path, mask, term):
    assert _check(tmp_path, mask, term) == []


def test_selects_ignored_squeezes_size_one_axes_and_needs_an_exact_match():
    ignored = torch.zeros(2, 4, 4, dtype=torch.bool)
    ignored[:, 0] = True
    assert selects_ignored(ignored.unsqueeze(1).float(), ignored)
    assert selects_ignored(ignored, ignored)
    assert not selects_ignored((~ignored).float(), ignored)
    assert not selects_ignored(ignored.float() * 0.5, ignored)  # not a 0/1 mask
    assert not selects_ignored(ignored.unsqueeze(1).expand(2, 3, 4, 4).float(), ignored)


def test_ignored_comparisons_reads_the_literal_a_constant_or_an_ignore_name():
    tree = ast.parse(textwrap.dedent("""\
        VOID = 255
        a = target == 255
        b = VOID == t
        c = t.eq(self.ignore_index)
        d = t != VOID
        e = t == 3
        """))
    assert [line for line, _ in ignored_comparisons(tree, 255)] == [2, 3, 4]
