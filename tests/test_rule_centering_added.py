"""centering-added (GD381): the source search for a running center added to the logits of a
softmax, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.centering_added import centers_added
from graddoctor.trace import TraceBuilder

SLUG = "centering-added"


def _found(src):
    return [(line, center) for line, _, center in centers_added(ast.parse(src))]


def test_a_center_added_inside_a_softmax_is_found_through_a_name_and_a_temperature():
    src = (
        "import torch.nn.functional as F\n"                                       # 1
        "class Loss:\n"                                                           # 2
        "    def forward(self, t, temp):\n"                                       # 3
        "        return F.softmax((t + self.center) / temp, dim=-1)\n"            # 4
        "def g(t, centre, temp):\n"                                               # 5
        "    z = centre + t\n"                                                    # 6
        "    return (z / temp).softmax(dim=-1)\n"                                 # 7
        "def update(self, t, centre):\n"                                          # 8
        "    self.center = self.center * 0.9 + 0.1 * t.mean(0)\n"                 # 9
        "    centre.mul_(0.9).add_(0.1 * t.mean(0))\n")                           # 10
    assert _found(src) == [(4, "self.center"), (6, "centre")]
    # a center never updated as a running value is a fixed prior
    assert _found(src.split("def update")[0]) == []


def test_subtracted_centers_other_sums_and_centers_outside_a_softmax_are_left_alone():
    src = (
        "import torch\n"
        "def f(t, center, temp, log_prior, offset):\n"
        "    a = torch.softmax((t - center) / temp, dim=-1)\n"
        "    b = torch.log_softmax(t + log_prior, dim=-1)\n"
        "    box = center + offset\n"
        "    return a, b, box\n")
    assert _found(src) == []


def test_the_finding_points_at_the_sum(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn.functional as F\n"                                       # 1
        "q = F.softmax((t + center) / 0.04, dim=-1)\n"                            # 2
        "loss.backward()\n"                                                       # 3
        "center = 0.9 * center + 0.1 * t.mean(0)\n")                              # 4
    t = TraceBuilder(str(script))
    t.backward(line=3)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert found[0].severity is Severity.WARNING and "`t - center`" in found[0].fix
