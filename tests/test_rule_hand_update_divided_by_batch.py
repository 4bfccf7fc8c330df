"""hand-update-divided-by-batch (GD277): the step a hand-written SGD update applied
(instrument/handstep.py's scale), the loss's reduction (the backward's loss_terms) and the
update's division by a batch's size in the source; scripts run through the library."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.rules.hand_update_divided_by_batch import divided_updates
from graddoctor.run.session import run_check

SLUG = "hand-update-divided-by-batch"

SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
batch_size = 8
X = torch.randn(128, 3)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5]])
loader = DataLoader(TensorDataset(X, Y), batch_size=batch_size)
w = torch.zeros(3, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
lr = 0.03
for epoch in range(3):
    for x, y in loader:
        l = (x @ w + b - y) ** 2
        {backward}
        with torch.no_grad():
            for p in (w, b):
                {update}
                p.grad.zero_()
"""
UPDATE_LINE = 18


def _check(tmp_path, backward="l.mean().backward()", update="p -= lr * p.grad / batch_size"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(backward=backward, update=update)))
    report = run_check(CheckOptions(target=str(script)))
    scales = [e.get("hand_step_scale") for e in report.analysis.events if e.kind == "backward"]
    return [f for f in report.findings if f.rule == SLUG], scales


def test_a_mean_loss_divided_again_by_the_batch(tmp_path):
    (f,), scales = _check(tmp_path)
    assert f.severity is Severity.WARNING and f.location.line == UPDATE_LINE
    assert f.evidence["step"] == pytest.approx(0.03 / 8, rel=1e-3)
    assert f.evidence["batch"] == 8 and f.evidence["lr"] == 0.03
    assert "0.03 / 8" in f.message and "8× smaller" in f.message
    assert sum(s is not None for s in scales) >= 2


@pytest.mark.parametrize("update", [
    "p.sub_(lr * p.grad / batch_size)",
    "p.add_(p.grad, alpha=-lr / batch_size)",
    "p -= lr / len(x) * p.grad",
    "p -= lr * p.grad / x.size(0)",
])
def test_the_spellings_of_the_update(tmp_path, update):
    found, _ = _check(tmp_path, update=update)
    assert len(found) == 1 and found[0].location.line == UPDATE_LINE


def test_the_sum_of_the_batch_divided_once_is_silent(tmp_path):
    found, scales = _check(tmp_path, backward="l.sum().backward()")
    assert found == [] and any(s is not None for s in scales)


def test_a_mean_loss_undivided_is_silent(tmp_path):
    assert _check(tmp_path, update="p -= lr * p.grad")[0] == []


def test_a_division_by_something_else_is_silent(tmp_path):
    assert _check(tmp_path, update="p -= lr * p.grad / (p.grad.norm() + 1e-8)")[0] == []


def test_a_step_that_is_not_lr_over_the_batch_is_silent(tmp_path):
    # the source's numbers (lr 0.03, batch 8) do not give the step measured (0.03 / 8 / 4)
    assert _check(tmp_path, update="p -= lr * p.grad / batch_size / 4")[0] == []


def test_momentum_by_hand_is_not_sized():
    # the parser side: a descent statement, its divisor and the factors left
    tree = ast.parse("for p in ps:\n    p -= lr * p.grad / batch_size\n    q.data = q.data - eta * q.grad / bs\n")
    found = divided_updates(tree)
    assert [(line, text) for line, text, _d, _f in found] == [(2, "batch_size"), (3, "bs")]
    assert divided_updates(ast.parse("p -= lr * p.grad / steps\n")) == []
