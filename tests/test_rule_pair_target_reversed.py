"""pair-target-reversed (GD377): the source search for RankNet losses whose pair target compares
the labels the other way round from the score difference, and the rule over a trace."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.pair_target_reversed import reversed_pair_targets
from graddoctor.trace import TraceBuilder

SLUG = "pair-target-reversed"


def _found(src: str):
    return [(h["line"], h["loss_line"], h["fixed"]) for h in reversed_pair_targets(ast.parse(src))]


def test_reversed_targets_are_found_at_the_comparison():
    assert _found("l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[j] > y[i]).float())\n") \
        == [(1, 1, "y[i] > y[j]")]
    assert _found("s_a, s_b = s[a], s[b]\np = torch.sigmoid(s_a - s_b)\n"
                  "t = (y[a] < y[b]).float()\nl = F.binary_cross_entropy(p, t)\n") == [(3, 4, "y[b] < y[a]")]
    assert _found("crit = nn.BCEWithLogitsLoss()\nd = model(x[i]) - model(x[j])\n"
                  "l = crit(d.squeeze(-1), (rel[i] - rel[j] < 0).float())\n") == [(3, 3, "0 < rel[i] - rel[j]")]


def test_right_and_unrelated_targets_stay_silent():
    for src in (
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[i] > y[j]).float())\n",
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[j] < y[i]).float())\n",
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[i] - y[j] > 0).float())\n",
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[i] == y[j]).float())\n",  # same / different
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], (y[k] > y[i]).float())\n",  # other indices
        "l = F.binary_cross_entropy_with_logits(s[i] - t[j], (y[j] > y[i]).float())\n",  # two score sets
        "l = F.binary_cross_entropy_with_logits(s[i] - s[j], pairs_target)\n",
        "l = F.mse_loss(s[i] - s[j], (y[j] > y[i]).float())\n",
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_comparison(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("target = (rel[j] > rel[i]).float()\n"
                      "loss = F.binary_cross_entropy_with_logits(s[i] - s[j], target)\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=3)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [1]
    assert found[0].severity is Severity.WARNING and "rel[i] > rel[j]" in found[0].fix
