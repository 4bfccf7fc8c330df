"""matching-cost-adds-overlap (GD355): the source walk that finds an overlap added to a cost a
matcher minimises, and the rule on a small script run in process."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.analysis.matching_cost import overlap_added_to_cost
from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "matching-cost-adds-overlap"


def _found(code: str):
    return [(line, term, how) for line, term, how, _ in
            overlap_added_to_cost(ast.parse(textwrap.dedent(code)))]


def test_an_overlap_added_to_a_minimised_cost_is_found_at_the_sum():
    assert _found("""
        def match(p, t):
            cost_giou = generalized_box_iou(p, t)
            C = 5 * torch.cdist(p, t, p=1) + 2 * cost_giou
            C = C.view(4, -1).cpu()
            return linear_sum_assignment(C)
    """) == [(4, "cost_giou", "linear_sum_assignment")]
    assert _found("""
        def match(p, t, w):
            sim = w * box_iou(p, t)
            cost = torch.cdist(p, t) + sim
            return [int(torch.argsort(cost[:, j])[0]) for j in range(t.shape[0])]
    """) == [(4, "sim", "argsort")]
    assert _found("""
        def match(p, t):
            return linear_sum_assignment((torch.cdist(p, t) + bbox_overlaps(p, t)).numpy())
    """) == [(3, "bbox_overlaps(p, t)", "linear_sum_assignment")]


def test_an_overlap_subtracted_or_maximised_is_silent():
    assert _found("""
        def match(p, t, w_giou):
            cost_giou = -generalized_box_iou(p, t)
            C = torch.cdist(p, t) + w_giou * cost_giou - 0.5 * box_iou(p, t)
            a = linear_sum_assignment(C.numpy())
            b = linear_sum_assignment(box_iou(p, t).numpy(), maximize=True)
            c = (torch.cdist(p, t) + (1 - box_iou(p, t))).argmin(0)
            d = torch.argsort(giou(p, t), descending=True)
            e = torch.cdist(p, t) + giou_loss(p, t)
            return a, b, c, d, e.argmin(0)
    """) == []


def test_the_rule_reports_at_the_cost_with_the_minimiser_related(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from scipy.optimize import linear_sum_assignment

        def box_iou(a, b):
            lt = torch.max(a[:, None, :2], b[None, :, :2])
            rb = torch.min(a[:, None, 2:], b[None, :, 2:])
            inter = (rb - lt).clamp(min=0).prod(-1)
            area = lambda x: (x[:, 2:] - x[:, :2]).prod(-1)
            return inter / (area(a)[:, None] + area(b)[None] - inter)

        torch.manual_seed(0)
        head = torch.nn.Linear(4, 12)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        for step in range(3):
            out = head(torch.randn(1, 4)).view(3, 4).sigmoid()
            boxes = torch.cat([out[:, :2] * 0.5, out[:, :2] * 0.5 + 0.1 + out[:, 2:] * 0.3], -1)
            gt = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.5, 0.5, 0.9, 0.9]])
            with torch.no_grad():
                cost = torch.cdist(boxes, gt, p=1) + box_iou(boxes, gt)
            rows, cols = linear_sum_assignment(cost.numpy())
            loss = (boxes[torch.as_tensor(rows)] - gt[torch.as_tensor(cols)]).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """))
    report = run_check(CheckOptions(target=str(script)))
    found = [f for f in report.findings if f.rule == SLUG]
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 20 and found[0].related[0].location.line == 21
    assert "box_iou(boxes, gt)" in found[0].message and "- box_iou(boxes, gt)" in found[0].fix
