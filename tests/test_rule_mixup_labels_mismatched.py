"""mixup-labels-mismatched (GD379): the source search for a mixup whose labels are mixed with
the other weight or another permutation than its inputs, and the rule over a trace whose
backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.mixup_labels_mismatched import mismatched_mixes
from graddoctor.trace import TraceBuilder

SLUG = "mixup-labels-mismatched"


def _found(src):
    return [(line, fault, input_line) for line, _, fault, input_line, _ in mismatched_mixes(ast.parse(src))]


def test_weights_swapped_in_the_two_term_loss_and_in_soft_targets():
    src = (
        "import torch\n"                                                            # 1
        "def train(model, x, y, crit, lam):\n"                                      # 2
        "    index = torch.randperm(x.size(0))\n"                                   # 3
        "    mixed_x = lam * x + (1 - lam) * x[index, :]\n"                         # 4
        "    y_a, y_b = y, y[index]\n"                                              # 5
        "    out = model(mixed_x)\n"                                                # 6
        "    return lam * crit(out, y_b) + (1 - lam) * crit(out, y_a)\n"            # 7
        "def soft(x, y1h, lam):\n"                                                  # 8
        "    index = torch.randperm(x.shape[0])\n"                                  # 9
        "    x = lam * x + (1 - lam) * x[index]\n"                                  # 10
        "    return x, (1 - lam) * y1h + lam * y1h[index]\n")                       # 11
    assert _found(src) == [(7, "weights", 4), (11, "weights", 10)]


def test_labels_read_through_another_draw_than_the_inputs():
    src = (
        "import torch\n"                                                            # 1
        "def mix(x, target, lam):\n"                                                # 2
        "    x = x * lam + x.flip(0) * (1. - lam)\n"                                # 3
        "    target = target * lam + target[torch.randperm(8)] * (1. - lam)\n"     # 4
        "    return x, target\n"                                                    # 5
        "def mix2(x, y, lam):\n"                                                    # 6
        "    p = torch.randperm(len(x))\n"                                          # 7
        "    q = torch.randperm(len(x))\n"                                          # 8
        "    return lam * x + (1 - lam) * x[p], lam * y + (1 - lam) * y[q]\n")      # 9
    assert _found(src) == [(4, "partner", 3), (9, "partner", 9)]


def test_mixes_that_agree_or_cannot_be_compared_are_left_alone():
    src = (
        "import torch\n"
        "def ok(model, x, y, crit, lam):\n"
        "    index = torch.randperm(x.size(0))\n"
        "    out = model(lam * x + (1 - lam) * x[index])\n"
        "    return lam * crit(out, y) + (1 - lam) * crit(out, y[index])\n"
        "def flips(x, t, lam):\n"
        "    return x * lam + x.flip(0) * (1. - lam), t * lam + t.flip(0) * (1. - lam)\n"
        "def handed_in(x, y, lam, perm, other):\n"                 # permutations of unknown origin
        "    return lam * x + (1 - lam) * x[perm], lam * y + (1 - lam) * y[other]\n"
        "def other_weights(x, y, lam, mu):\n"                      # not the same weight: not compared
        "    i = torch.randperm(4)\n"
        "    return lam * x + (1 - lam) * x[i], mu * y[i] + (1 - mu) * y\n"
        "def gp(real, fake, alpha):\n"                             # no permutation: not a mixup
        "    return alpha * real + (1 - alpha) * fake\n"
        "def batch_rows(X, Y, lam):\n"                             # a batch drawn by index is no partner
        "    rows = torch.randint(0, 9, (4,))\n"
        "    x, y = X[rows], Y[rows]\n"
        "    i = torch.randperm(4)\n"
        "    return lam * x + (1 - lam) * x[i], lam * y + (1 - lam) * y[i]\n")
    assert _found(src) == []


def test_the_finding_points_at_the_labels_mix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                                            # 1
        "lam = 0.3\n"                                                               # 2
        "index = torch.randperm(8)\n"                                               # 3
        "x = lam * x + (1 - lam) * x[index]\n"                                      # 4
        "target = lam * target[index] + (1 - lam) * target\n"                       # 5
        "loss.backward()\n")                                                        # 6
    t = TraceBuilder(str(script))
    t.backward(line=6)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [5]
    assert found[0].severity is Severity.WARNING and "swapped" in found[0].message
