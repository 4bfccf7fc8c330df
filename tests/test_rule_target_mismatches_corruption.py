"""target-mismatches-corruption (GD383): the source search for a flow-matching target that is
the negated velocity of the script's interpolation, and for a score-matching target at a noise
level the noise was never scaled by; the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.target_mismatches_corruption import (interpolation, reversed_velocities,
                                                            unscaled_noise)
from graddoctor.trace import TraceBuilder

SLUG = "target-mismatches-corruption"


def _value(src):
    return ast.parse(src).body[0].value


def test_each_spelling_of_a_straight_path():
    assert interpolation(_value("(1 - t) * a + t * b")) == ("a", "b", "t")
    assert interpolation(_value("t * b + a * (1 - t)")) == ("a", "b", "t")
    assert interpolation(_value("a + t * (b - a)")) == ("a", "b", "t")
    assert interpolation(_value("torch.lerp(a, b, t)")) == ("a", "b", "t")
    assert interpolation(_value("a.lerp(b, t[:, None])")) == ("a", "b", "t[:,None]")
    # a weight of 1 - t runs the lerp from its end to its start
    assert interpolation(_value("torch.lerp(b, a, 1 - t)")) == ("a", "b", "t")
    assert interpolation(_value("b.lerp(a, 1.0 - t)")) == ("a", "b", "t")
    assert interpolation(_value("(1 - t) * a - t * b")) is None
    assert interpolation(_value("alpha * a + beta * b")) is None


def test_the_negated_velocity_is_found_inline_or_through_a_name():
    src = (
        "def step(x0, x1, t):\n"                                          # 1
        "    xt = (1 - t) * x0 + t * x1\n"                                # 2
        "    target = x0 - x1\n"                                          # 3
        "    loss = F.mse_loss(model(xt, t), target)\n"                   # 4
        "    xs = x0 + t * (x1 - x0)\n"                                   # 5
        "    other = ((model(xs, t) - (x0 - x1)) ** 2).mean()\n")         # 6
    assert [s["line"] for s in reversed_velocities(ast.parse(src))] == [3, 6]


def test_consistent_conventions_and_samplers_against_the_output_are_left_alone():
    src = (
        "def step(x0, x1, t):\n"
        "    xt = (1 - t) * x0 + t * x1\n"
        "    loss = F.mse_loss(model(xt, t), x1 - x0)\n"
        "    xr = t * x0 + (1 - t) * x1\n"
        "    loss = loss + F.mse_loss(model(xr, t), x0 - x1)\n"
        "    gap = x0 - x1\n"
        "    print(gap.norm())\n")
    assert reversed_velocities(ast.parse(src)) == []
    swapped_lerp = ("xt = torch.lerp(x1, x0, 1 - t)\n"
                    "loss = F.mse_loss(model(xt, t), x1 - x0)\n")
    assert reversed_velocities(ast.parse(swapped_lerp)) == []
    assert [s["line"] for s in reversed_velocities(ast.parse(swapped_lerp.replace("x1 - x0", "x0 - x1")))] == [2]
    sampler = (
        "xt = (1 - t) * x0 + t * x1\n"
        "loss = F.mse_loss(model(xt, t), x0 - x1)\n"
        "for k in range(10):\n"
        "    x = x - model(x, k / 10) / 10\n")
    assert reversed_velocities(ast.parse(sampler)) == []


def test_unscaled_noise_under_a_scaled_score_target():
    src = (
        "def dsm(x, sigma):\n"                                            # 1
        "    z = torch.randn_like(x)\n"                                   # 2
        "    xn = x + z\n"                                                # 3
        "    target = -z / sigma ** 2\n"                                  # 4
        "    return ((score(xn, sigma) - target) ** 2).sum(1).mean()\n")  # 5
    found = unscaled_noise(ast.parse(src))
    assert [(s["line"], s["target_line"], s["level"]) for s in found] == [(3, 4, "sigma")]


def test_scaled_noise_and_epsilon_targets_are_left_alone():
    src = (
        "def dsm(x, sigma):\n"
        "    z = torch.randn_like(x)\n"
        "    xn = x + sigma * z\n"
        "    loss = F.mse_loss(score(xn, sigma), -z / sigma)\n"
        "    e = torch.randn_like(x)\n"
        "    xe = x + e\n"
        "    loss = loss + F.mse_loss(eps_net(xe), e)\n"
        "    ratio = e / sigma\n"
        "    print(ratio)\n"
        "    return loss\n")
    assert unscaled_noise(ast.parse(src)) == []


def test_the_finding_points_at_the_target_with_the_velocity_as_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                            # 1
        "xt = (1 - t) * x0 + t * x1\n"                              # 2
        "loss = F.mse_loss(model(xt, t), x0 - x1)\n"                # 3
        "loss.backward()\n")                                        # 4
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
    assert "x1 - x0" in found[0].fix


def test_silent_without_a_backward_in_the_script(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text("xt = (1 - t) * x0 + t * x1\nloss = F.mse_loss(model(xt, t), x0 - x1)\n")
    t = TraceBuilder(str(script))
    assert list(find_rule(SLUG)().check(Analysis(t.trace))) == []
