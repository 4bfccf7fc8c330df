"""recurrence-never-carried (GD344): the source search for loops whose state is reassigned from
its starting value each pass, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.recurrence_never_carried import stale_recurrences
from graddoctor.trace import TraceBuilder

SLUG = "recurrence-never-carried"


def _found(src: str):
    return stale_recurrences(ast.parse(src))


def test_a_step_from_the_start_value_is_found_with_its_fix():
    src = ("def rollout(f, x0, n):\n"        # 1
           "    x = x0\n"                    # 2
           "    xs = [x0]\n"                 # 3
           "    for _ in range(n):\n"        # 4
           "        x = step(f, x0, 0.1)\n"  # 5
           "        xs.append(x)\n"          # 6
           "    return xs\n")
    assert _found(src) == [(5, "x", "x0", 2, "x = step(f, x, 0.1)")]


def test_euler_inline_and_a_cell_given_its_initial_state_are_found():
    euler = "z = z0\nwhile t < 1:\n    z = z0 + dt * f(z0)\n    t += dt\n"
    assert [r[:3] for r in _found(euler)] == [(3, "z", "z0")]
    cell = "h = h_init\nfor _ in range(5):\n    h = cell(c, h_init)\n    outs.append(head(h))\n"
    assert _found(cell)[0][4] == "h = cell(c, h)"
    prefixed = "state = initial_state\nfor _ in range(3):\n    state = env_step(initial_state)\n"
    assert [r[1:3] for r in _found(prefixed)] == [("state", "initial_state")]


def test_right_loops_stay_silent():
    for src in (
        "x = x0\nfor _ in range(3):\n    x = step(x)\n",                          # reads itself
        "x = x0\nfor t in ts:\n    x = exact(x0, t)\n",                            # changes per pass
        "h = h0\nfor t in range(T):\n    h = cell(inp[t], h0)\n",                  # not judged
        "x = x0\nfor _ in range(3):\n    x = x0 + 0.1 * torch.randn_like(x0)\n",   # a draw
        "x = x0\nfor _ in range(3):\n    x0 = x0 * 2\n    x = f(x0)\n",            # start updated
        "x = x0\nfor _ in range(3):\n    x = f(x, x0)\n",                          # augmented
        "x = base\nfor _ in range(3):\n    x = f(base)\n",                         # not a start name
        "x = x0 * 1\nfor _ in range(3):\n    x = f(x0)\n",                         # an expression
        "x = x0\nfor _ in range(3):\n    y = g(x)\n    x = f(x0)\n",               # read first
        "x = x0\nfor _ in range(3):\n    x = f(x0)\n    x = g(x)\n",               # two bindings
        "x = x0\nx = x * 2\nfor _ in range(3):\n    x = f(x0)\n",                  # rebound since
        "x = x0\nwhile x.norm() > 1:\n    x = f(x0)\n",                            # test reads it
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_assignment_in_the_loop(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("x = x0\n"
                      "for _ in range(4):\n"
                      "    x = rk4(f, x0)\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
    assert "rk4(f, x)" in found[0].fix
