"""warmup-never-ends (GD139): a warm-up's length (scheduler arguments, or a LambdaLR's straight
rise) against the run the script plans (instrument/planned.py: the loop around its DataLoader
loop); scripts run through the library."""

from __future__ import annotations

import ast
import sys
import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.instrument import planned as planned_module
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "warmup-never-ends"

SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epochs = {epochs}
scheduler = {scheduler}
for epoch in range({loop}):
    for x, y in loader:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        {per_batch}
    {per_epoch}
"""

LINEAR = "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters={n})"
LAMBDA = "torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / {n}))"


def _check(tmp_path, scheduler, epochs=3, loop="epochs", per_batch="scheduler.step()",
           per_epoch="pass"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(scheduler=scheduler, epochs=epochs, loop=loop,
                                                    per_batch=per_batch, per_epoch=per_epoch)))
    report = run_check(CheckOptions(target=str(script)))
    planned = [e.get("planned") for e in report.analysis.events if e.kind == "epoch_start"]
    return [f for f in report.findings if f.rule == SLUG], planned


def test_a_linear_warm_up_longer_than_the_run_is_a_warning(tmp_path):
    (f,), planned = _check(tmp_path, LINEAR.format(n=100))
    assert planned[0] == ["epochs", 3]
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert f.evidence["warmup"] == 100 and f.evidence["planned"] == 24
    assert "24% of the way" in f.message


def test_a_one_cycle_sized_past_the_run(tmp_path):
    (f,), _ = _check(tmp_path, "torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, "
                               "total_steps=epochs * len(loader) * 10)")
    assert f.evidence["warmup"] == 72 and f.evidence["planned"] == 24


def test_a_lambda_ramp_is_extrapolated(tmp_path):
    (f,), _ = _check(tmp_path, LAMBDA.format(n=200))
    assert f.evidence["warmup"] == pytest.approx(200, abs=2)


def test_the_range_start_counts(tmp_path):
    (f,), planned = _check(tmp_path, LINEAR.format(n=30), epochs=10, loop="7, epochs")
    assert planned[0] == ["epochs", 3] and f.evidence["planned"] == 24


def test_per_epoch_stepping_counts_epochs(tmp_path):
    (f,), _ = _check(tmp_path, LINEAR.format(n=40), epochs=20, per_batch="pass",
                     per_epoch="scheduler.step()")
    assert f.evidence["planned"] == 20


@pytest.mark.parametrize("scheduler, epochs, loop, per_batch, per_epoch", [
    (LINEAR.format(n=20), 3, "epochs", "scheduler.step()", "pass"),  # ends at step 20 of 24
    (LAMBDA.format(n=20), 3, "epochs", "scheduler.step()", "pass"),
    (LINEAR.format(n=5), 100, "epochs", "pass", "scheduler.step()"),  # 5 of 100 epochs
    ("torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=epochs * len(loader))",
     3, "epochs", "scheduler.step()", "pass"),
    (LINEAR.format(n=100), 3, "abs(-epochs)", "scheduler.step()", "pass"),  # no plan read
    ("torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, 1e-3 * 2 ** s))", 3,
     "epochs", "scheduler.step()", "pass"),  # not a straight ramp
])
def test_silent(tmp_path, scheduler, epochs, loop, per_batch, per_epoch):
    found, planned = _check(tmp_path, scheduler, epochs, loop, per_batch, per_epoch)
    assert found == [] and planned  # the script ran its loop


class _Args:
    def __init__(self):
        self.calls = 0
        self.epochs = 3

    @property
    def steps(self):
        self.calls += 1
        return 10


def test_the_evaluator_runs_no_code_of_the_script():
    args = _Args()
    cfg = {"epochs": 4}
    items = [1, 2]
    frame = sys._getframe()
    ev = planned_module._evaluate
    real_len = lambda v: len(v) if type(v) in (list, tuple) else None  # noqa: E731

    def value(text):
        return ev(ast.parse(text, mode="eval").body, frame, real_len)

    assert value("args.epochs * 2") == 6 and value("cfg['epochs'] - 1") == 3
    assert value("max(len(items), 1)") == 2
    for text in ("args.steps", "print(1)", "cfg['missing']", "args.epochs.bit_length()"):
        with pytest.raises(planned_module._Unknown):
            value(text)
    assert args.calls == 0 and items == [1, 2]


# -- a loop without a DataLoader: its plan from the budget's wait for the next pass ------------

SLICED = """
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
X, Y = torch.randn(160, 4), torch.randn(160, 1)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = {scheduler}
for epoch in range({epochs}):
    for i in range(0, len(X), 8):
        optimizer.zero_grad()
        F.mse_loss(model(X[i:i + 8]), Y[i:i + 8]).backward()
        optimizer.step()
        {per_batch}
    {per_epoch}
"""


def _sliced(tmp_path, scheduler, epochs, per_batch="pass", per_epoch="scheduler.step()"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SLICED.format(scheduler=scheduler, epochs=epochs,
                                                    per_batch=per_batch, per_epoch=per_epoch)))
    report = run_check(CheckOptions(target=str(script)))
    holds = [e for e in report.analysis.events if e.kind == "phase_hold"]
    return [f for f in report.findings if f.rule == SLUG], holds


def test_a_sliced_loop_gives_its_plan(tmp_path):
    (f,), holds = _sliced(tmp_path, LAMBDA.format(n=400), epochs=30)
    assert holds[0]["planned"] == ["epochs", 30] and holds[0]["passes"] == 1
    assert holds[0]["until"] == 21  # 20 updates a pass, and the first of the next
    assert f.location.line == 9 and f.evidence["warmup"] == 399 and f.evidence["planned"] == 30
    assert "once per epoch" in f.message and "inside the batch loop" in f.fix


@pytest.mark.parametrize("scheduler, epochs, per_batch, per_epoch", [
    (LAMBDA.format(n=5), 30, "pass", "scheduler.step()"),  # 5 of 30 epochs
    (LAMBDA.format(n=100), 30, "scheduler.step()", "pass"),  # 100 of 600 updates
    ("torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, 0.01 * 10 ** (s / 2)))", 30,
     "pass", "scheduler.step()"),  # not a straight line: two points extrapolate nothing
])
def test_sliced_loops_silent(tmp_path, scheduler, epochs, per_batch, per_epoch):
    found, holds = _sliced(tmp_path, scheduler, epochs, per_batch, per_epoch)
    assert found == [] and holds
