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
