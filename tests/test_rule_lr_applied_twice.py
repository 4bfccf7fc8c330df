"""lr-applied-twice (GD138): the loss's constant factor (autograd graph) or a hand edit's factor
(instrument/editfactor.py) equal to the optimizer's lr; scripts run through the library."""

from __future__ import annotations

import textwrap

import pytest
import torch

from graddoctor.findings import Severity
from graddoctor.instrument.editfactor import EditFactors
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "lr-applied-twice"

SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
lr = {lr}
optimizer = torch.optim.{cls}(model.parameters(), lr=lr)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(8):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    {backward}
    for p in model.parameters():
        {edit}
    optimizer.step()
"""


def _check(tmp_path, backward="loss.backward()", edit="pass", lr=0.05, cls="SGD"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(backward=backward, edit=edit, lr=lr, cls=cls)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG], report


def test_a_loss_times_the_lr_is_a_warning_at_that_line(tmp_path):
    (f,), report = _check(tmp_path, backward="(loss * lr).backward()")
    assert f.severity is Severity.WARNING and f.location.line == 13
    assert f.evidence["how"] == "loss" and f.evidence["factor"] == pytest.approx(0.05)
    assert "lr² × grad" in f.message
    assert not [g for g in report.findings if g.rule == "accumulation-never-accumulates"]


def test_a_grad_edit_by_the_lr_is_a_warning_at_the_edit(tmp_path):
    (f,), _ = _check(tmp_path, edit="p.grad *= lr")
    assert f.severity is Severity.WARNING and f.location.line == 15
    assert f.evidence["how"] == "grad_edit" and f.evidence["edits"] >= 2


def test_under_adam_it_is_info(tmp_path):
    (f,), _ = _check(tmp_path, backward="(loss * lr).backward()", lr=3e-4, cls="Adam")
    assert f.severity is Severity.INFO and "eps" in f.message


@pytest.mark.parametrize("backward, edit, lr", [
    ("(loss * 0.5).backward()", "pass", 0.05),  # a loss weight
    ("(loss * 0.1).backward()", "pass", 0.1),  # a weight equal to the lr, no lr named
    ("loss.backward()", "p.grad *= 0.5", 0.05),  # a constant that is not the lr
    ("loss.backward()", "p.grad.clamp_(-0.01, 0.01)", 0.05),  # no constant factor
])
def test_silent(tmp_path, backward, edit, lr):
    assert _check(tmp_path, backward=backward, edit=edit, lr=lr)[0] == []


def test_edit_factors_per_group():
    a, b = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}], lr=0.1)
    (a.sum() + (b * b).sum()).backward()
    factors = EditFactors()
    factors.observe(1, [0, 1], [a.grad, b.grad])
    a.grad.mul_(0.1)
    b.grad.mul_(0.01)
    out = factors.factors(1, opt, [0, 1], [0, 1])
    assert out == [pytest.approx(0.1), pytest.approx(0.01)]
    b.grad.add_(1.0)  # not a constant factor any more
    assert factors.factors(1, opt, [0, 1], [1]) == [pytest.approx(0.1), None]


def test_a_group_scaled_in_part_has_no_factor():
    a, b = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([a, b], lr=0.1)
    (a.sum() + (b * b).sum()).backward()
    factors = EditFactors()
    factors.observe(1, [0, 1], [a.grad, b.grad])
    a.grad.mul_(0.1)  # the weight only, not the bias
    assert factors.factors(1, opt, [0, 1], [0]) is None
    assert factors.factors(2, opt, [0, 1], [0]) is None  # a backward ran since the samples
