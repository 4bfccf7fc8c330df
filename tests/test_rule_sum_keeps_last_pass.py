"""sum-keeps-last-pass (GD361): the source search for loops that mean to sum a loss over their
passes and keep only the last one, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.sum_keeps_last_pass import last_pass_sums
from graddoctor.trace import TraceBuilder

SLUG = "sum-keeps-last-pass"


def _found(src: str):
    return [r[:4] for r in last_pass_sums(ast.parse(src))]


def test_a_sum_overwritten_by_each_pass_is_found_with_the_zero_it_started_from():
    src = ("s = 0.0\n"                             # 1
           "for i in layers:\n"                    # 2
           "    s = F.mse_loss(g(f[i]), t[i])\n"   # 3
           "loss = c + w * s\n")                   # 4
    assert _found(src) == [(3, "s", "overwritten", 1)]
    assert last_pass_sums(ast.parse(src))[0][5] == "s = s + F.mse_loss(g(f[i]), t[i])"
    zeros = "s = torch.zeros(())\nfor k in ks:\n    s = k * term(k)\nloss = s\n"
    assert _found(zeros) == [(3, "s", "overwritten", 1)]


def test_a_sum_reset_inside_the_loop_is_found_at_the_reset():
    src = ("for n in sizes:\n"                     # 1
           "    s = 0\n"                           # 2
           "    s += spectral(p, t, n)\n"          # 3
           "loss = s + l1\n")                      # 4
    assert _found(src) == [(2, "s", "reset", 3)]


def test_sums_written_right_and_values_kept_on_purpose_are_not():
    for src in (
        "s = 0\nfor x in xs:\n    s += f(x)\nloss = s\n",
        "s = 0\nfor x in xs:\n    s = s + f(x)\nloss = s\n",
        "h = x\nfor layer in layers:\n    h = layer(h)\nloss = h.sum()\n",  # no zero
        "b = 0\nfor k, v in enumerate(vs):\n    if v > 0:\n        b = k\nloss = b\n",  # a search
        "b = 0\nfor k in ks:\n    b = k\n    break\nloss = b\n",
        "loss = 0\nfor x, y in data:\n    loss = crit(m(x), y)\n    loss.backward()\nprint(loss)\n",
        "s = 0\nfor x in xs:\n    s = f(x)\n    out.append(s)\nloss = s\n",  # each pass used
        "s = 0\nfor s in xs:\n    pass\nloss = s\n",  # the loop's own target
        "s = 0\ns = 1\nfor x in xs:\n    s = f(x)\nloss = s\n",  # not zero when the loop starts
    ):
        assert _found(src) == [], src


def test_the_rule_reports_a_sum_that_reaches_a_backward_that_ran(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("for step in range(3):\n"               # 1
                      "    s = 0.0\n"                          # 2
                      "    for i in layers:\n"                 # 3
                      "        s = crit(feats[i], t[i])\n"     # 4
                      "    loss = c + s\n"                     # 5
                      "    loss.backward()\n"                  # 6
                      "    shown = 0.0\n"                      # 7
                      "    for i in layers:\n"                 # 8
                      "        shown = crit(feats[i], t[i]).item()\n"  # 9
                      "    print(shown)\n")                    # 10
    t = TraceBuilder(str(script))
    t.backward(line=6)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]  # the logged total reaches no backward
    assert found[0].severity is Severity.WARNING
    assert "s = s + crit(feats[i], t[i])" in found[0].fix
    assert "line 6" in found[0].message


def test_the_rule_is_silent_without_a_backward_in_the_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("s = 0.0\nfor i in layers:\n    s = crit(f[i])\nloss = s\nloss.backward()\n")
    t = TraceBuilder(str(script))
    assert list(find_rule(SLUG)().check(Analysis(t.trace))) == []
