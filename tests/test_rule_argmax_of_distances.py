"""argmax-of-distances (GD319): the source search for argmax (or max's positions) of pairwise
distances, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.argmax_of_distances import argmax_sites
from graddoctor.trace import TraceBuilder

SLUG = "argmax-of-distances"


def _sites(src):
    return [(line, call) for line, call, _ in argmax_sites(ast.parse(src))]


def test_each_spelling_of_a_pairwise_distance_is_found():
    src = (
        "import torch\n"                                                               # 1
        "def quantise(z, e):\n"                                                        # 2
        "    d = torch.cdist(z, e)\n"                                                  # 3
        "    a = d.argmax(1)\n"                                                        # 4
        "    b = torch.max(d, 1)[1]\n"                                                 # 5
        "    _, c = d.max(dim=1)\n"                                                    # 6
        "    f = torch.norm(z[:, None] - e[None], dim=-1).argmax(-1)\n"                # 7
        "    g = ((z.unsqueeze(1) - e.unsqueeze(0)) ** 2).sum(-1).argmax(-1)\n"        # 8
        "    s = z.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2 * z @ e.t()\n"    # 9
        "    h = torch.argmax(s, dim=1)\n"                                             # 10
        "    m = torch.addmm(torch.sum(z ** 2, dim=1, keepdim=True) + torch.sum(e ** 2, dim=1),"
        " z, e.t(), alpha=-2.0, beta=1.0)\n"                                           # 11
        "    k = m.view(-1, 8).argmax(dim=1)\n")                                       # 12
    assert [line for line, _ in _sites(src)] == [4, 5, 6, 7, 8, 10, 12]


def test_the_expanded_distance_is_found_in_any_order_of_its_terms():
    src = (
        "import torch\n"                                                                  # 1
        "def quantise(z, e):\n"                                                           # 2
        "    d = z.pow(2).sum(1, keepdim=True) - 2 * z @ e.t() + e.pow(2).sum(1)[None]\n"  # 3
        "    a = d.argmax(1)\n"                                                           # 4
        "    d2 = -2 * torch.matmul(z, e.t()) + (e ** 2).sum(1) + (z ** 2).sum(1, keepdim=True)\n"  # 5
        "    b = torch.argmax(d2, dim=1)\n"                                               # 6
        "    s = 2 * z @ e.t() - z.pow(2).sum(1, keepdim=True) - e.pow(2).sum(1)\n"       # 7
        "    c = s.argmax(1)\n"                                                           # 8
        "    n = -(z.pow(2).sum(1, keepdim=True) - 2 * z @ e.t() + e.pow(2).sum(1))\n"    # 9
        "    k = n.argmax(1)\n")                                                          # 10
    assert [line for line, _ in _sites(src)] == [4, 6]


def test_negations_similarities_values_errors_and_intended_farthest_are_left_alone():
    src = (
        "import torch\n"
        "def f(z, e, pred, y):\n"
        "    d = torch.cdist(z, e)\n"
        "    a = torch.argmin(d, dim=1)\n"
        "    b = torch.argmax(-d, dim=1)\n"
        "    c = (z @ e.t()).argmax(1)\n"
        "    v = torch.max(d, 1)[0]\n"
        "    w, _ = d.max(dim=1)\n"
        "    u = d.max()\n"
        "    hardest = (pred - y).pow(2).sum(1).argmax(0)\n"
        "    farthest = torch.max(d, -1)[1]\n"
        "    hard_negative = d.argmax(dim=1)\n"
        "    d = z @ e.t()\n"
        "    best = d.argmax(dim=1)\n")
    assert _sites(src) == []


def test_the_finding_points_at_the_argmax_with_an_argmin_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                   # 1
        "dist = torch.cdist(z, codes)\n"                   # 2
        "idx = torch.argmax(dist, dim=1)\n"                # 3
        "loss.backward()\n")                               # 4
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
    assert "torch.argmin(dist, dim=1)" in found[0].fix


def test_silent_without_a_backward_in_the_script(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text("import torch\nidx = torch.cdist(z, codes).argmax(1)\n")
    t = TraceBuilder(str(script))
    assert list(find_rule(SLUG)().check(Analysis(t.trace))) == []


def test_numpy_calls_with_an_axis_are_read_too():
    src = (
        "import numpy as np\n"
        "def assign(z, e):\n"
        "    d = torch.cdist(z, e).detach().cpu().numpy()\n"
        "    a = np.argmax(d, axis=1)\n"
        "    b = np.argmax(d)\n"
        "    c = np.argmin(d, axis=1)\n")
    assert _sites(src) == [(4, "np.argmax(d, axis=1)")]
