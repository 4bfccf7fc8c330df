"""derivative-axis-mismatch (GD345): the source search for autograd derivatives whose name's
direction is not the coordinate of the column they read, and the rule over a trace."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.derivative_axis_mismatch import mislabelled_derivatives
from graddoctor.trace import TraceBuilder

SLUG = "derivative-axis-mismatch"
GRAD = "torch.autograd.grad"


def _found(src: str):
    return mislabelled_derivatives(ast.parse(src))


def test_a_second_derivative_read_from_the_other_named_column():
    src = (f"du = {GRAD}(u, xt, torch.ones_like(u), create_graph=True)[0]\n"
           "u_x, u_t = du[:, 0:1], du[:, 1:2]\n"
           f"u_xx = {GRAD}(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, 1:2]\n")
    assert _found(src) == [(3, "u_xx", "x", 1, "t", "named")]


def test_a_first_derivative_against_the_stacking_order():
    src = ("def residual(net, x, t):\n"
           "    xt = torch.stack([x, t], dim=-1).requires_grad_(True)\n"
           "    u = net(xt)\n"
           f"    g = {GRAD}(u.sum(), xt, create_graph=True)[0]\n"
           f"    u_t = {GRAD}(u, xt, torch.ones_like(u), create_graph=True)[0][..., 0]\n"
           "    return u_t\n")
    assert _found(src) == [(5, "u_t", "t", 0, "x", "stacked")]


def test_right_readings_stay_silent():
    for src in (
        # (t, x) order read so, and a mixed derivative
        f"tx = torch.cat([t, x], 1)\ndu = {GRAD}(u, tx, o, create_graph=True)[0]\n"
        "u_t, u_x = du[:, 0:1], du[:, 1:2]\n"
        f"u_xx = {GRAD}(u_x, tx, o, create_graph=True)[0][:, 1:2]\n"
        f"u_xt = {GRAD}(u_x, tx, o, create_graph=True)[0][:, 0:1]\n",
        # separate tensors
        f"u_x = {GRAD}(u, x, o, create_graph=True)[0]\nu_t = {GRAD}(u, t, o, create_graph=True)[0]\n",
        # names that spell no direction, a column chosen by a variable
        f"du = {GRAD}(u, xt, o)[0]\ndudx = du[:, 1]\ng_k = {GRAD}(u, xt, o)[0][:, k]\n",
        # first derivatives that do not agree one to one: nothing to judge against
        f"du = {GRAD}(u, xt, o)[0]\nu_x, u_t = du[:, 0:1], du[:, 0:1]\n"
        f"u_xx = {GRAD}(u_x, xt, o)[0][:, 1:2]\n",
        # stacked from expressions, no named first derivatives
        f"xt = torch.cat([x * 2, t], 1)\nu_xx = {GRAD}(u_x, xt, o)[0][:, 1:2]\n",
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_derivative(tmp_path):
    script = tmp_path / "pinn.py"
    script.write_text(f"du = {GRAD}(u, xt, o, create_graph=True)[0]\n"
                      "u_x, u_t = du[:, 0:1], du[:, 1:2]\n"
                      f"u_xx = {GRAD}(u_x, xt, o, create_graph=True)[0][:, 1:2]\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
