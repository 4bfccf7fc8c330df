"""ignored-labels-clamped (GD285): the source search for classification losses whose labels are
clamped at 0, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.ignored_labels_clamped import clamped_label_losses
from graddoctor.trace import TraceBuilder

SLUG = "ignored-labels-clamped"


def _found(src: str):
    return [(h["line"], h["loss_line"], h["labels"]) for h in clamped_label_losses(ast.parse(src))]


def test_clamped_labels_are_found_at_the_clamp():
    assert _found("l = F.cross_entropy(logits, yc.clamp(min=0))\n") == [(1, 1, "yc")]
    assert _found("yt = y.clamp(0, 4)\nl = F.cross_entropy(out, yt)\n") == [(1, 2, "y")]
    assert _found("crit = nn.CrossEntropyLoss()\nl = crit(out, torch.clamp(y, min=0))\n") == [(2, 2, "y")]
    assert _found("l = F.nll_loss(lp, tags[i].reshape(-1).clamp_min(0))\n") == [(1, 1, "tags[i].reshape(-1)")]


def test_right_uses_stay_silent():
    for src in (
        'l = F.cross_entropy(out, y.clamp(min=0), reduction="none")\n',
        'crit = nn.CrossEntropyLoss(reduction="none")\nl = crit(out, y.clamp(min=0))\n',
        "l = F.cross_entropy(out[y >= 0], y[y >= 0].clamp(min=0))\n",
        "keep = y >= 0\nl = F.cross_entropy(out[keep], y[keep].clamp(min=0))\n",
        "l = F.cross_entropy(out, (x * 10).long().clamp(0, 9))\n",
        "l = F.cross_entropy(out, y.clamp(max=4))\n",
        "l = F.cross_entropy(out, y, ignore_index=-1)\n",
        "l = F.mse_loss(out, y.clamp(min=0))\n",
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_clamp(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("yt = y.clamp(min=0)\n"
                      "loss = F.cross_entropy(out, yt)\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=3)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [1]
    assert found[0].severity is Severity.WARNING
    assert "ignore_index" in found[0].fix


def _hows(src: str):
    return [(h["line"], h["how"]) for h in clamped_label_losses(ast.parse(src))]


def test_missing_labels_set_to_zero_are_found_at_the_fill():
    assert _hows("missing = labels == -1\nt = labels.masked_fill(missing, 0)\n"
                 "l = F.cross_entropy(out, t)\n") == [(2, "fill")]
    assert _hows("l = F.cross_entropy(out, y.masked_fill(y < 0, 0))\n") == [(1, "fill")]
    assert _hows("ce = nn.CrossEntropyLoss()\nys = torch.where(y.eq(-100), torch.zeros_like(y), y)\n"
                 "l = ce(out, ys)\n") == [(2, "fill")]
    assert _hows("t = y.masked_fill(unlabelled, 0)\nl = F.nll_loss(lp, t)\n") == [(1, "fill")]


def test_nan_regression_targets_set_to_zero_are_found():
    assert _hows("t = torch.nan_to_num(y, nan=0.0)\nl = F.mse_loss(pred, t)\n") == [(1, "nan")]
    assert _hows("l = F.l1_loss(pred, y.nan_to_num())\n") == [(1, "nan")]
    assert _hows("crit = nn.SmoothL1Loss()\nl = crit(p, y.masked_fill(torch.isnan(y), 0))\n") == [(2, "nan")]
    assert _hows("l = F.huber_loss(p, torch.where(y.isnan(), 0.0, y))\n") == [(1, "nan")]


def test_fills_that_are_right_stay_silent():
    for src in (
        "t = labels.masked_fill(labels == -1, -100)\nl = F.cross_entropy(out, t)\n",
        "t = tokens.masked_fill(tokens < 0, 0)\nl = F.cross_entropy(out, t, ignore_index=0)\n",
        "ce = nn.CrossEntropyLoss(ignore_index=0)\nl = ce(out, y.masked_fill(y < 0, 0))\n",
        "t = labels.masked_fill(iou < 0.4, 0)\nl = F.cross_entropy(out, t)\n",  # background by design
        "t = labels.masked_fill(labels > 3, 0)\nl = F.cross_entropy(out, t)\n",
        "t = y.masked_fill(y < 0, 0)\nl = F.cross_entropy(out, t, reduction='none')\n",
        "t = torch.nan_to_num(y)\nl = F.mse_loss(pred, t, reduction='none')\n",
        "t = torch.nan_to_num(y, nan=-1.0)\nl = F.mse_loss(pred, t)\n",
        "m = torch.isnan(y)\nl = F.mse_loss(pred.masked_fill(m, 0), y.masked_fill(m, 0))\n",
        "t = y.masked_fill(y < 0, 0)\nl = F.mse_loss(pred, t)\n",  # a regression's negative values
        "t = torch.nan_to_num(y)\nl = F.cross_entropy(out, t)\n",
    ):
        assert _found(src) == [], src
