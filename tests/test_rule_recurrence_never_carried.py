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


def test_stages_from_the_state_added_to_the_start_are_found():
    rk4 = ("def rk4(f, y0, t):\n"                                   # 1
           "    ys = [y0]\n"                                         # 2
           "    y = y0\n"                                            # 3
           "    for i in range(len(t) - 1):\n"                       # 4
           "        h = t[i + 1] - t[i]\n"                           # 5
           "        k1 = f(t[i], y)\n"                               # 6
           "        k2 = f(t[i] + h, y + h * k1)\n"                  # 7
           "        y = y0 + h / 2 * (k1 + k2)\n"                    # 8
           "        ys.append(y)\n"                                  # 9
           "    return ys\n")
    assert _found(rk4) == [(8, "y", "y0", 3, "y = y + h / 2 * (k1 + k2)")]
    minus = "x = x_init\nxs = []\nfor t in ts:\n    g = grad(x)\n    x = x_init - lr * g\n    xs.append(x)\n"
    assert [r[:3] for r in _found(minus)] == [(5, "x", "x_init")]


def test_increments_on_the_start_that_are_right_stay_silent():
    for src in (
        # Picard iteration of an implicit step: the iterates are not a trajectory
        "x = x0\nfor _ in range(3):\n    s = f(x)\n    x = x0 + h * s\n",
        # a drift at each time: the increment does not come from the state
        "x = x0\nxs = []\nfor k in range(3):\n    d = v * k\n    x = x0 + d\n    xs.append(x)\n",
        # a draw around the start
        "x = x0\nxs = []\nfor k in range(3):\n    s = f(x)\n    x = x0 + s * torch.randn_like(x0)\n    xs.append(x)\n",
        # the start is not the leftmost term
        "x = x0\nxs = []\nfor k in range(3):\n    s = f(x)\n    x = s * x0\n    xs.append(x)\n",
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


# -- seen in the loss's graph: equal predictions each compared with a different target ----------

ROLLOUT = ("for x, ys in loader:\n"                   # 1
           "    state = x\n"                           # 2
           "    loss = 0\n"                            # 3
           "    for k in range(3):\n"                  # 4
           "        state = model(x)\n"                # 5
           "        loss = loss + mse(state, ys[:, k])\n"  # 6
           "    loss.backward()\n"                     # 7
           "    opt.step()\n")                         # 8


def test_the_restarted_rollout_statement_is_found_whatever_its_names():
    from graddoctor.rules.recurrence_never_carried import restarted_rollout

    assert stale_recurrences(ast.parse(ROLLOUT)) == []  # `x` is not named as the state's start
    assert restarted_rollout(ast.parse(ROLLOUT)) == (5, "state = model(x)", "state", "state = model(state)")
    assert restarted_rollout(ast.parse(ROLLOUT.replace("model(x)", "model(state)"))) is None
    assert restarted_rollout(ast.parse(ROLLOUT.replace("    state = x\n", "    h = x\n"))) is None


def _repeated_trace(tmp_path, text, how="repeated"):
    from graddoctor import events as ev

    script = tmp_path / "train.py"
    script.write_text(text)
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.same_compared(how=how, op="mse_loss", core="AddmmBackward0", shape=[8, 4],
                           params=[0, 1], starts=["AddmmBackward0"]), line=7)
    t.backward(fresh=[0, 1], line=7)
    t.step(0, line=8)
    return list(find_rule(SLUG)().check(Analysis(t.trace)))


def test_repeated_twins_point_at_the_restarted_step(tmp_path):
    found = _repeated_trace(tmp_path, ROLLOUT)
    assert [f.location.line for f in found] == [5]
    assert found[0].fix.endswith("`state = model(state)`") and found[0].evidence["how"] == "repeated"
    # another kind of twins is loss-compares-with-itself's
    assert _repeated_trace(tmp_path, ROLLOUT, how="twins") == []
    # no statement in the source: the backward, with a fix in words
    found = _repeated_trace(tmp_path, ROLLOUT.replace("    state = x\n", "    h = x\n"))
    assert [f.location.line for f in found] == [7] and "previous step's prediction" in found[0].fix


def test_the_watcher_sees_a_rollout_restarted_from_its_input():
    import torch
    import torch.nn.functional as F
    from torch import nn

    from graddoctor.instrument.samevalue import SameValueWatcher
    from test_rule_loss_compares_with_itself import _Rec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))

    def events(restart):
        rec = _Rec(list(model.parameters()))
        watcher = SameValueWatcher(rec)
        for _ in range(3):
            x, ys = torch.randn(6, 4), torch.randn(6, 3, 4)
            state, loss = x, 0
            for k in range(3):
                state = model(x if restart else state)
                loss = loss + F.mse_loss(state, ys[:, k])
            watcher.describe_loss(loss)
            loss.backward()
        return [made[1]["how"] for made in rec.events]

    assert events(restart=True) == ["repeated"]
    assert events(restart=False) == []
