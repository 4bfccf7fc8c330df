"""overlap-on-raw-scores (GD385): the ``overlap_scores`` event of instrument/overlapscores.py for a
soft dice/IoU ratio whose scores are a layer's signed output, the source lookup of the function
that takes them, and the rule on hand-written traces."""

from __future__ import annotations

import ast
import textwrap

import torch
import torch.nn as nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.graphpaths import post_order
from graddoctor.instrument.overlapscores import raw_overlap
from graddoctor.rules.overlap_on_raw_scores import overlap_site
from rule_traces import builder, findings, only

SLUG = "overlap-on-raw-scores"


def _ratios(loss):
    return [found for node in post_order(loss.grad_fn, 10000) or ()
            if type(node).__name__ == "DivBackward0" and (found := raw_overlap(node)) is not None]


def _dice(p, t):
    return 1 - (2 * (p * t).sum(-1) + 1) / (p.sum(-1) + t.sum(-1) + 1)


def test_a_dice_on_a_linear_output_is_seen_and_one_on_probabilities_is_not():
    torch.manual_seed(0)
    head = nn.Linear(8, 32)
    x = torch.randn(4, 8)
    mask = (torch.rand(4, 32) > 0.5).float()
    assert _ratios(_dice(head(x), mask).mean()) == [("linear", (4, 32))]
    assert _ratios(_dice(head(x).sigmoid(), mask).mean()) == []
    assert _ratios(_dice(torch.relu(head(x)), mask).mean()) == []
    # a masked mean divides by the mask's count, not by the scores
    assert _ratios(((head(x) * mask).sum() / mask.sum()).mean()) == []
    # soft targets are no mask
    assert _ratios(_dice(head(x), torch.rand(4, 32)).mean()) == []


def test_the_source_names_the_function_taking_the_scores():
    src = textwrap.dedent("""
        def dice_loss(inputs, targets, num_masks):
            inputs = inputs.flatten(1)
            numerator = 2 * (inputs * targets).sum(-1)
            denominator = inputs.sum(-1) + targets.sum(-1)
            return (1 - (numerator + 1) / (denominator + 1)).sum() / num_masks

        def iou(pred, gt):
            inter = (pred * gt).sum()
            return inter / (pred.sum() + gt.sum() - inter)
    """)
    tree = ast.parse(src)
    # two functions compute a ratio: no single site is claimed
    assert overlap_site(tree) is None
    one = ast.parse(src.split("def iou")[0])
    assert overlap_site(one) == (3, "dice_loss", "inputs")
    squashed = ast.parse(src.split("def iou")[0].replace("inputs.flatten(1)", "inputs.sigmoid().flatten(1)"))
    assert overlap_site(squashed) is None


def test_the_rule_reports_a_warning_at_the_backward_without_source():
    t = builder()
    t.put(ev.overlap_scores(shape=[8, 256], producer="matmul"), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "matmul" in f.message and "sigmoid" in f.fix
    assert findings(builder(), SLUG) == []


def test_a_bounded_activation_shifted_into_the_unit_range_is_no_raw_score():
    import torch
    from graddoctor.instrument.overlapscores import producer
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    assert producer((0.5 * torch.tanh(x @ w) + 0.5).grad_fn) is None
    assert producer((torch.sigmoid(x) / 2 + 0.25).grad_fn) is None
    assert producer((x @ w + x).grad_fn) == "sum"  # a raw sum stays one
    assert producer((x @ w).grad_fn) == "matmul"
