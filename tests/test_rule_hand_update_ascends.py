"""hand-update-ascends (GD128): the direction the first hand-written updates take
(instrument/handstep.py), and the rule on small scripts run in process."""

from __future__ import annotations

import textwrap

import pytest
import torch

from graddoctor.findings import Severity
from graddoctor.instrument.handstep import HandStepDirection
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "hand-update-ascends"


def _cosines(update, dtype=torch.float32, parameter=True, steps=4):
    torch.manual_seed(0)
    w = torch.randn(5, 3, dtype=dtype)
    w = torch.nn.Parameter(w) if parameter else w.requires_grad_()
    direction, out = HandStepDirection(), []
    for _ in range(steps):
        w.grad = None
        (w.sum() * torch.randn(())).pow(2).backward()
        out.append(direction.observe([0], [w], {0} if out else set()))
        with torch.no_grad():
            update(w)
    return out


def test_descent_is_minus_one_and_ascent_plus_one():
    down = _cosines(lambda w: w.sub_(0.1 * w.grad))
    assert down[0] is None and all(c == pytest.approx(-1.0) for c in down[1:])
    up = _cosines(lambda w: w.add_(0.1 * w.grad))
    assert all(c == pytest.approx(1.0) for c in up[1:])


def test_float64_parameters_are_sampled_as_copies_and_plain_tensors_not_at_all():
    assert _cosines(lambda w: w.add_(0.1 * w.grad), dtype=torch.float64)[1] == pytest.approx(1.0)
    assert _cosines(lambda w: w.add_(0.1 * w.grad), parameter=False)[1:] == [None] * 3


def test_only_the_first_few_updates_are_measured():
    measured = [c for c in _cosines(lambda w: w.sub_(0.1 * w.grad), steps=9) if c is not None]
    assert len(measured) == 4


SCRIPT = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    for step in range(5):
        x, y = torch.randn(8, 6), torch.randint(0, 2, (8,))
        {name} = F.cross_entropy(model(x), y)
        model.zero_grad()
        {name}.backward()
        with torch.no_grad():
            for p in model.parameters():
                {update}
"""


def _check(tmp_path, name="loss", update="p += 0.1 * p.grad"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(name=name, update=update)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_an_update_adding_the_gradient_of_a_loss_is_a_warning_at_that_line(tmp_path):
    (f,) = _check(tmp_path)
    assert f.severity is Severity.WARNING and f.location.line == 15
    assert f.evidence["cosines"] == [1.0, 1.0, 1.0, 1.0] and "+1.00" in f.message


@pytest.mark.parametrize("name, update", [
    ("loss", "p -= 0.1 * p.grad"),  # descent
    ("loss", "p.add_(p.grad, alpha=-0.1)"),
    ("objective", "p += 0.1 * p.grad"),  # climbed on purpose, not called a loss
])
def test_silent_on_descent_and_on_an_objective_climbed_on_purpose(tmp_path, name, update):
    assert _check(tmp_path, name, update) == []


ADAM = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for t in range(1, 7):
        x, y = torch.randn(16, 6), torch.randint(0, 2, (16,))
        loss = F.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p, (m, v) in zip(params, moments):
                m.mul_(0.9).add_(p.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.addcdiv_(m / (1 - 0.9 ** t), (v / (1 - 0.999 ** t)).sqrt() + 1e-8, value={sign}0.01)
"""


def _check_adam(tmp_path, sign):
    script = tmp_path / "adam.py"
    script.write_text(textwrap.dedent(ADAM.format(sign=sign)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_a_hand_written_adam_that_adds_its_step_is_found_at_the_update_not_the_moments(tmp_path):
    (f,) = _check_adam(tmp_path, "")
    assert f.location.line == 19  # p.addcdiv_, not m.mul_(0.9).add_(p.grad, ...)
    assert all(0.1 < c < 0.99 for c in f.evidence["cosines"])


def test_a_hand_written_adam_that_subtracts_its_step_is_silent(tmp_path):
    assert _check_adam(tmp_path, "-") == []
