"""grad-edit-after-step (GD362): which in-place gradient edits after a loop's last optimizer step
are found, read from the loop's source with the lines the run recorded steps on."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.rules.grad_edit_after_step import GradEditAfterStep, edits_after_last_step


def _loop(code: str):
    tree = ast.parse(textwrap.dedent(code))
    return next(n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While)))


def _steps(code: str) -> set[int]:
    return {i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1)
            if "opt" in line and ".step()" in line}


CENTER = """
for x, y in loader:
    opt.zero_grad(); opt_c.zero_grad()
    loss.backward()
    opt.step()
    opt_c.step()
    for param in center_loss.parameters():
        param.grad.data *= 1.0 / weight
"""


def test_rescaling_after_the_last_step_is_found():
    assert edits_after_last_step(_loop(CENTER), _steps(CENTER)) == (
        8, "param.grad.data *= 1.0 / weight", 6)


@pytest.mark.parametrize("code", [
    # the rescaling between the model's step and the centres' step
    """
    for x, y in loader:
        opt.zero_grad(); opt_c.zero_grad()
        loss.backward()
        opt.step()
        for param in center_loss.parameters():
            param.grad.data *= 1.0 / weight
        opt_c.step()
    """,
    # zeroed by hand after the step
    """
    for x, y in loader:
        loss.backward()
        opt.step()
        for p in model.parameters():
            p.grad *= 0
    """,
    # the step under an accumulation if: the rescaling reaches the next step
    """
    for i, (x, y) in enumerate(loader):
        loss.backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
        for p in model.parameters():
            p.grad.mul_(0.5)
    """,
    # an input's gradient, not a parameter's
    """
    for x, y in loader:
        loss.backward()
        opt.step()
        delta.grad.mul_(0.5)
    """,
])
def test_silent_on(code):
    assert edits_after_last_step(_loop(code), _steps(code)) is None


def test_rule_metadata():
    rule = GradEditAfterStep()
    assert rule.code == "GD362" and rule.slug == "grad-edit-after-step"
