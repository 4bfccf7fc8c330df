"""loss-weight-rounds-to-zero (GD155): what counts as a rounded value, the terms of a loss
multiplied by 0 (instrument/lossterms.py), and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from graddoctor.analysis.source import rounded_value, without_rounding
from graddoctor.findings import Severity
from graddoctor.instrument.lossterms import zero_weighted_terms
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "loss-weight-rounds-to-zero"


def _expr(text):
    return ast.parse(text, mode="eval").body


@pytest.mark.parametrize("text", ["min(1, step // warmup)", "int(step / 1000) * w",
                                  "round(epoch / total) * lam", "math.floor(step / n)",
                                  "-(step // k)"])
def test_rounded_values(text):
    assert rounded_value(_expr(text))


@pytest.mark.parametrize("text", ["min(1.0, step / warmup)", "(step // 4) % 2", "step % 4 / 4",
                                  "x.view(n // 2)", "beta", "0.0", "float(step) / n"])
def test_values_that_do_not_round(text):
    assert not rounded_value(_expr(text))


def test_the_fix_takes_the_rounding_out():
    assert without_rounding(_expr("min(1, step // warmup)")) == "min(1, step / warmup)"
    assert without_rounding(_expr("round(epoch / total) * lam")) == "epoch / total * lam"


def test_terms_multiplied_by_zero_in_a_sum_are_counted_but_not_a_zeroed_loss():
    w = torch.randn(3, requires_grad=True)
    a, b = w.pow(2).sum(), w.abs().sum()
    assert zero_weighted_terms((a + 0 * b).grad_fn) == 1
    assert zero_weighted_terms((0.5 * (a + b * 0.0) - 0 * a).grad_fn) == 2
    assert zero_weighted_terms((a + 0.1 * b).grad_fn) == 0
    assert zero_weighted_terms((0 * (a + b)).grad_fn) == 0  # the whole loss: no gradient at all
    assert zero_weighted_terms((a + torch.tensor(0.0) * b).grad_fn) == 0  # a computed tensor


SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
warmup = 100
{setup}
for step in range({steps}):
    out = model(torch.randn(8, 4))
    weight = {weight}
    loss = out.pow(2).mean() + weight * out.abs().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _check(tmp_path, weight, steps=5, setup=""):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(weight=weight, steps=steps, setup=setup)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_a_weight_rounded_to_zero_at_every_backward_is_a_warning_at_its_line(tmp_path):
    (f,) = _check(tmp_path, "min(1, step // warmup)")
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert f.evidence["backwards"] == 5 and f.evidence["name"] == "weight"
    assert "true division" in f.fix and "step / warmup" in f.fix


@pytest.mark.parametrize("weight", ["min(1.0, step / warmup)", "min(1, step // 2)", "0.0",
                                    "zero_weight"])
def test_silent_on_an_anneal_a_weight_that_turns_on_or_a_weight_written_as_zero(tmp_path, weight):
    assert _check(tmp_path, weight, setup="zero_weight = int(0)") == []


def test_silent_on_a_single_backward(tmp_path):
    assert _check(tmp_path, "min(1, step // warmup)", steps=1) == []
