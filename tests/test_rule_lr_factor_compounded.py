"""lr-factor-compounded (GD380): the source search for a param group's lr multiplied in place
by a factor computed from the loop's counter, and the rule over a trace whose backward names
the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.lr_factor_compounded import compounded_factors
from graddoctor.trace import TraceBuilder

SLUG = "lr-factor-compounded"


def _found(src):
    return [(line, counter) for line, _, _, counter in compounded_factors(ast.parse(src))]


def test_a_factor_of_the_step_multiplied_into_the_lr_is_found():
    src = (
        "import math\n"                                                              # 1
        "for step in range(10):\n"                                                   # 2
        "    f = min(1.0, (step + 1) / 4)\n"                                         # 3
        "    for g in opt.param_groups:\n"                                           # 4
        "        g['lr'] *= f\n"                                                     # 5
        "it = 0\n"                                                                   # 6
        "while it < 10:\n"                                                           # 7
        "    opt.param_groups[0]['lr'] = opt.param_groups[0]['lr'] * math.cos(it)\n"  # 8
        "    it += 1\n")                                                             # 9
    assert _found(src) == [(5, "step"), (8, "it")]


def test_constant_decays_milestones_and_base_lr_schedules_are_left_alone():
    src = (
        "gamma = 0.9\n"
        "for epoch in range(10):\n"
        "    for g in opt.param_groups:\n"
        "        g['lr'] *= gamma\n"                           # a constant decay: on purpose
        "        g['lr'] *= 0.99\n"
        "    if epoch in (3, 6):\n"
        "        for g in opt.param_groups:\n"
        "            g['lr'] *= 0.1 * (epoch // 3)\n"          # under a milestone test
        "    f = epoch / 10\n"
        "    for g in opt.param_groups:\n"
        "        g['lr'] = base_lr * f\n"                      # set from the base lr
        "opt.param_groups[0]['lr'] *= 0.5\n")                  # outside a loop
    assert _found(src) == []


def test_a_factor_of_the_group_index_is_a_per_group_scale():
    # layer-wise lr decay set once: the loop over the groups visits each group once
    setup = ("for depth, g in enumerate(opt.param_groups):\n"
             "    g['lr'] *= decay ** (n_layers - 1 - depth)\n"
             "for i in range(len(opt.param_groups)):\n"
             "    opt.param_groups[i]['lr'] *= 0.5 ** i\n")
    assert _found(setup) == []
    # the same scale inside the training loop compounds per step, but by a constant per group
    assert _found("for step in range(9):\n" + "".join("    " + l + "\n" for l in setup.splitlines())) == []
    # a step factor multiplied into each group still compounds
    warm = ("for step in range(9):\n    f = (step + 1) / 9\n"
            "    for depth, g in enumerate(opt.param_groups):\n        g['lr'] *= f\n")
    assert [line for line, *_ in _found(warm)] == [4]


def test_a_ratio_of_consecutive_schedule_values_telescopes():
    for ratio in ("sched(step) / sched(step - 1)", "sched(step + 1) / sched(step)"):
        src = f"for step in range(1, 9):\n    f = {ratio}\n    for g in opt.param_groups:\n        g['lr'] *= f\n"
        assert _found(src) == [], ratio
    # a ratio of two different schedules is a factor of the step like any other
    other = "for step in range(1, 9):\n    for g in opt.param_groups:\n        g['lr'] *= warm(step) / cos(step)\n"
    assert [line for line, *_ in _found(other)] == [3]


def test_the_finding_points_at_the_multiplication(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "for step in range(5):\n"                                                    # 1
        "    warm = (step + 1) / 5\n"                                                # 2
        "    for g in opt.param_groups:\n"                                           # 3
        "        g['lr'] *= warm\n"                                                  # 4
        "    loss.backward()\n")                                                     # 5
    t = TraceBuilder(str(script))
    t.backward(line=5)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]
    assert found[0].severity is Severity.WARNING and "compound" in found[0].message
