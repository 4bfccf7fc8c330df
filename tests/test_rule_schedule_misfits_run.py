"""schedule-misfits-run (GD276): each schedule projected over the run the script plans (the loop
around its DataLoader loop, instrument/planned.py) in the unit it is stepped in; scripts run
through the library."""

from __future__ import annotations

import textwrap

import pytest

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check
from rule_traces import builder, findings, only

SLUG = "schedule-misfits-run"
NEIGHBOURS = {SLUG, "scheduler-period-mismatch", "lr-collapsed", "warmup-never-ends"}

SCRIPT = """
import itertools
import torch
from tqdm import tqdm, trange
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=4)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epochs = {epochs}
scheduler = {scheduler}
for epoch in {loop}:
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        {per_batch}
    {per_epoch}
"""
LINE = 13  # the scheduler's construction


def _check(tmp_path, scheduler, epochs=90, loop="range(epochs)", per_batch="scheduler.step()",
           per_epoch="pass"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(scheduler=scheduler, epochs=epochs, loop=loop,
                                                    per_batch=per_batch, per_epoch=per_epoch)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule in NEIGHBOURS]


def _one(found):
    assert [f.rule for f in found] == [SLUG], [(f.rule, f.message) for f in found]
    return found[0]


def test_a_steplr_in_epochs_stepped_per_batch(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)"))
    assert f.severity is Severity.WARNING and f.location.line == LINE
    assert f.evidence["side"] == "spent" and f.evidence["planned_steps"] == 90 * 64
    assert f.evidence["at"] == 60
    assert "in the first epoch" in f.message and "step_size=30 * len(loader)" in f.fix


def test_the_same_steplr_stepped_per_epoch_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)",
                  per_batch="pass", per_epoch="scheduler.step()") == []


@pytest.mark.parametrize("scheduler", [
    "torch.optim.lr_scheduler.StepLR(optimizer, step_size=30 * len(loader), gamma=0.1)",
    "torch.optim.lr_scheduler.MultiStepLR(optimizer, [30 * len(loader), 60 * len(loader)])",
    "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))",
    "torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9999)",
    "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=5)",
])
def test_per_batch_schedules_sized_in_steps_are_silent(tmp_path, scheduler):
    assert _check(tmp_path, scheduler) == []


def test_milestones_in_epochs_past_the_first_epoch(tmp_path):
    # 64 batches an epoch: milestone 60 passes inside the first epoch, 100 in the second;
    # scheduler-period-mismatch (one epoch only) does not see the second
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[30, 100])"))
    assert f.evidence["at"] == 100 and "epoch 2 of 90" in f.message


def test_an_exponential_decay_per_epoch_stepped_per_batch(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.95)",
                    epochs=20))
    assert f.evidence["at"] == 90 and "gamma=0.95 ** (1 / len(loader))" in f.fix


def test_a_cosine_shorter_than_an_epoch_is_left_to_period_mismatch(tmp_path):
    found = _check(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)",
                   epochs=20)
    assert [f.rule for f in found] == ["scheduler-period-mismatch"]


def test_a_cosine_in_batches_stepped_per_epoch_never_moves(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, "
                              "T_max=epochs * len(loader))", epochs=30, per_batch="pass",
                    per_epoch="scheduler.step()"))
    assert f.evidence["side"] == "still" and "stepped once per epoch" in f.message


def test_a_cosine_in_epochs_stepped_per_epoch_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)",
                  epochs=30, per_batch="pass", per_epoch="scheduler.step()") == []


def test_a_run_of_unknown_length_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)",
                  loop="itertools.count()") == []


def test_a_short_run_whose_decay_outlasts_its_first_epoch_is_silent(tmp_path):
    # 5 epochs x 64 batches: 100x by batch 60 would be 19% of the run; the fine-tune of a few
    # epochs is not judged by its first tenth
    assert _check(tmp_path, "torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[80, 100])",
                  epochs=5) == []


def test_a_plateau_scheduler_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)",
                  per_batch="scheduler.step(loss.item())") == []


@pytest.mark.parametrize("loop", ["tqdm(range(epochs), desc='epoch')", "trange(epochs)",
                                  "enumerate(range(epochs))"])
def test_an_epoch_loop_wrapped_in_a_progress_bar_is_read(tmp_path, loop):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)",
                    loop=loop))
    assert f.evidence["planned_steps"] == 90 * 64


def test_a_warm_up_named_in_epochs_stepped_per_batch(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, "
                              "total_iters=epochs // 18)"))
    assert f.evidence["at"] == 5 and "`epochs // 18`" in f.message


@pytest.mark.parametrize("total", ["5", "warmup_steps", "warmup_epochs * len(loader)",
                                   "epochs * steps_per_epoch // 100"])
def test_a_warm_up_in_steps_is_silent(tmp_path, total):
    scheduler = (f"(warmup_steps := 5, warmup_epochs := 1, steps_per_epoch := 64) and "
                 f"torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters={total})")
    assert _check(tmp_path, scheduler) == []


def test_a_one_cycle_over_the_epoch_count_stepped_per_batch(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, "
                              "total_steps=epochs)"))
    assert f.evidence["at"] == 90 and "ValueError" in f.message and "steps_per_epoch" in f.fix


def test_a_one_cycle_over_the_run_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, "
                            "epochs=epochs, steps_per_epoch=len(loader))") == []


# -- sized in the run's batches, stepped once per accumulated update -------------------------------

ACCUM_SCRIPT = """
import math
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epochs, accum = 30, {accum}
scheduler = {scheduler}
for epoch in range(epochs):
    for i, (x, y) in enumerate(loader):
        loss = F.mse_loss(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            {per_update}
"""


def _accum(tmp_path, scheduler, accum=4, per_update="scheduler.step()"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(ACCUM_SCRIPT.format(scheduler=scheduler, accum=accum,
                                                          per_update=per_update)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule in NEIGHBOURS]


@pytest.mark.parametrize("scheduler, arg", [
    ("torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=epochs * len(loader))",
     "total_steps"),
    ("torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))", "T_max"),
    ("torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=len(loader) * epochs)",
     "total_iters"),
])
def test_a_schedule_sized_in_micro_batches_stepped_per_update(tmp_path, scheduler, arg):
    f = _one(_accum(tmp_path, scheduler))
    assert f.location.line == 12 and f.severity is Severity.WARNING
    assert f.evidence["side"] == "micro" and f.evidence["k"] == 4
    assert f.evidence["length"] == 30 * 16 and f.evidence["planned_steps"] == 30 * 4
    assert f.evidence["covered"] == 0.25
    assert f"= 30 epochs × 16 batches" in f.message and "never finishes" in f.message
    assert f.fix.startswith(f"count its {arg} in optimizer steps") and "math.ceil(len(loader) / 4)" in f.fix


@pytest.mark.parametrize("scheduler", [
    "torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=epochs * math.ceil(len(loader) / accum))",
    "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader) // accum)",
    "torch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 1.0, total_iters=epochs * len(loader))",  # a warm-up
])
def test_a_schedule_sized_in_updates_is_silent(tmp_path, scheduler):
    assert [f for f in _accum(tmp_path, scheduler) if f.rule == SLUG] == []


def test_without_accumulation_a_schedule_in_batches_is_silent(tmp_path):
    found = _accum(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))",
                   accum=1)
    assert [f for f in found if f.rule == SLUG] == []


def test_the_frameworks_loops_give_their_planned_epochs():
    from types import SimpleNamespace

    from graddoctor.instrument.planned import _lightning_epochs

    def loop(max_epochs=5, max_steps=-1, limit=1.0):
        return SimpleNamespace(max_epochs=max_epochs, epoch_loop=SimpleNamespace(max_steps=max_steps),
                               trainer=SimpleNamespace(limit_train_batches=limit))

    assert _lightning_epochs(loop()) == ["epochs", 5]
    assert _lightning_epochs(loop(max_steps=100)) is None  # the steps decide
    assert _lightning_epochs(loop(limit=0.25)) is None  # epochs cut short
    assert _lightning_epochs(loop(max_epochs=None)) is None
    # Lightning sets max_epochs to -1 when max_steps alone ends the run: its optimizer steps
    assert _lightning_epochs(loop(max_epochs=-1, max_steps=100)) == ["updates", 100]
    assert _lightning_epochs(loop(max_epochs=-1, max_steps=100, limit=0.5)) is None


def _updates_run(t_max: int, max_steps: int = 40, per_epoch: int = 8):
    """A framework's run bounded by ``max_steps`` optimizer steps (``["updates", N]``), its
    scheduler stepped once at the end of each of two epochs, as Lightning's default interval
    does."""
    t = builder(cls="AdamW")
    t.put(ev.scheduler_init(sched=0, cls="CosineAnnealingLR", opt=0, args={"T_max": t_max, "eta_min": 0},
                            base_lrs=[1e-3], lrs=[1e-3]), 25)
    for number in range(3):
        planned = ["updates", max_steps] if number == 0 else None
        t.put(ev.epoch_start(loader=0, epoch=number, real_len=per_epoch, replay_len=per_epoch,
                             planned=planned), 30)
        for _ in range(per_epoch if number < 2 else 1):
            t.clear([0, 1], line=26)
            t.backward(fresh=[0, 1], line=20, batch=[0, number])
            t.step(0, line=26)
        if number < 2:
            t.put(ev.scheduler_step(sched=0, cls="CosineAnnealingLR", opt=0, lrs=[1e-3]), 26)
    return t


def test_a_schedule_of_the_runs_max_steps_stepped_per_epoch_barely_acts():
    found = only(_updates_run(t_max=40).trace, SLUG)
    assert found.location.line == 25 and found.evidence["sized_in"] == "optimizer_steps"
    assert found.evidence["planned_steps"] == 5  # 40 steps are 5 epochs of 8 updates


def test_a_per_epoch_schedule_under_max_steps_is_silent():
    assert findings(_updates_run(t_max=4).trace, SLUG) == []  # sized in epochs
    assert findings(_updates_run(t_max=40, max_steps=400).trace, SLUG) == []  # not the run's



def test_a_cosine_over_one_epoch_of_batches_cycles_over_the_run(tmp_path):
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, "
                              "T_max=len(loader))", epochs=20))
    assert f.evidence["side"] == "cycles" and f.location.line == LINE
    assert "climbs back up" in f.message and "CosineAnnealingWarmRestarts" in f.fix


def test_a_cosine_over_the_whole_run_in_batches_is_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, "
                            "T_max=epochs * len(loader))", epochs=20) == []


SLICED = """
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
X, Y = torch.randn(320, 4), torch.randn(320, 1)
batches = list(zip(X.split(16), Y.split(16)))
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
epochs = {epochs}
scheduler = {scheduler}
for epoch in range(epochs):
    for xb, yb in batches:
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()
        {per_batch}
    {per_epoch}
"""


def _sliced(tmp_path, scheduler, epochs, per_batch="pass", per_epoch="scheduler.step()"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SLICED.format(scheduler=scheduler, epochs=epochs,
                                                    per_batch=per_batch, per_epoch=per_epoch)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule in NEIGHBOURS]


def test_a_hand_decay_in_updates_stepped_per_epoch_in_a_loop_without_loader(tmp_path):
    f = _one(_sliced(tmp_path, "torch.optim.lr_scheduler.LambdaLR(optimizer, "
                               "lambda e: 1 - e / (epochs * len(batches)))", epochs=12))
    # sized from len(batches): meant per batch, so the step() call is in the wrong loop
    assert f.evidence["side"] == "still" and [r.location.line for r in f.related] == [11]
    assert f.location.line != 11 and "inside the batch loop" in f.fix
    assert "one pass of the loop at line 12" in f.message and "DataLoader" not in f.message
    assert "falls to 0 after 240 steps" in f.message


def test_a_cosine_in_epochs_stepped_per_batch_in_a_loop_without_loader(tmp_path):
    f = _one(_sliced(tmp_path, "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)",
                     epochs=90, per_batch="scheduler.step()", per_epoch="pass"))
    assert f.evidence["side"] == "spent" and "steps_per_epoch" in f.fix


@pytest.mark.parametrize("scheduler, per_batch, per_epoch", [
    ("torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1 - e / epochs)", "pass",
     "scheduler.step()"),
    ("torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(batches))",
     "scheduler.step()", "pass"),
    ("torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)", "pass",
     "scheduler.step()"),
])
def test_loops_without_loader_sized_in_their_unit_are_silent(tmp_path, scheduler, per_batch, per_epoch):
    assert _sliced(tmp_path, scheduler, 12, per_batch, per_epoch) == []


def test_a_linear_decay_to_zero_sized_in_one_epoch_of_a_longer_run(tmp_path):
    """num_training_steps=len(loader) in a 3-epoch run: the lr is 0 for the last two epochs."""
    f = _one(_check(tmp_path, "__import__('transformers').get_linear_schedule_with_warmup("
                              "optimizer, num_warmup_steps=2, num_training_steps=len(loader))",
                    epochs=3))
    assert f.evidence["side"] == "ends" and f.location.line == LINE
    assert "num_training_steps counts the batches of one epoch" in f.message
    assert "(67% of the run) apply no update" in f.message
    assert "epochs * len(loader)" in f.fix


@pytest.mark.parametrize("scheduler,epochs", [
    # sized over every epoch of the run
    ("__import__('transformers').get_linear_schedule_with_warmup(optimizer, 0, epochs * len(loader))", 3),
    # one epoch's batches, and the run is one epoch
    ("__import__('transformers').get_linear_schedule_with_warmup(optimizer, 0, len(loader))", 1),
    # a decay to a floor, held after the first epoch: a design, not an lr of 0
    ("torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=len(loader))", 3),
])
def test_a_decay_sized_in_batches_that_the_run_does_not_outlast(tmp_path, scheduler, epochs):
    assert _check(tmp_path, scheduler, epochs=epochs) == []


def test_milestones_named_in_epochs_are_spent_though_a_multiple_of_the_epoch(tmp_path):
    """A 128-epoch run of 64 batches an epoch: the milestone `epochs // 2` is 64, a multiple of
    the epoch's batches, which alone would read as a length sized in batches; the text names it
    in epochs, so stepped per batch it is spent in the first epoch."""
    f = _one(_check(tmp_path, "torch.optim.lr_scheduler.MultiStepLR(optimizer, "
                              "milestones=[epochs // 2], gamma=0.01)", epochs=128))
    assert f.location.line == LINE and f.evidence["side"] == "spent"


def test_milestones_named_in_epochs_and_converted_to_batches_are_silent(tmp_path):
    assert _check(tmp_path, "torch.optim.lr_scheduler.MultiStepLR(optimizer, "
                            "milestones=[int(epochs * 0.6) * len(loader)])", epochs=12) == []


SHORT_PASS = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn({n}, 4), torch.randn({n}, 1)), batch_size=4)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = {scheduler}
for epoch in range({epochs}):
    for x, y in loader:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    scheduler.step()
"""


def _short_pass(tmp_path, scheduler, n, epochs):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SHORT_PASS.format(scheduler=scheduler, n=n, epochs=epochs)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule in NEIGHBOURS]


@pytest.mark.parametrize("scheduler", [
    "torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)",
    "torch.optim.lr_scheduler.StepLR(optimizer, 20, gamma=0.5)",
])
def test_a_bare_epoch_count_dividing_by_a_short_pass_is_silent(tmp_path, scheduler):
    # 8 or 10 batches per epoch: 16 or 20 being a multiple is a coincidence, not a batch count
    n = 32 if "MultiStep" in scheduler else 40
    assert _short_pass(tmp_path, scheduler, n=n, epochs=3) == []


def test_a_bare_batch_count_of_a_long_pass_stepped_per_epoch_is_still_reported(tmp_path):
    # 640 = 10 epochs of 64 batches, written out as a number and stepped once per epoch
    f = _one(_short_pass(tmp_path, "torch.optim.lr_scheduler.StepLR(optimizer, step_size=640, "
                                   "gamma=0.1)", n=256, epochs=12))
    assert f.evidence["side"] == "still"


ACCUMULATED = """
import math
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn({n}, 4), torch.randn({n}, 1)), batch_size=4)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
num_epochs, accum = {epochs}, {accum}
steps = {steps}
scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=steps, power=1.0)
for epoch in range(num_epochs):
    for i, (x, y) in enumerate(loader):
        (F.mse_loss(model(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
"""


def _accumulated(tmp_path, steps, epochs, n=256, accum=4):
    script = tmp_path / "train.py"
    script.write_text(ACCUMULATED.format(steps=steps, epochs=epochs, n=n, accum=accum))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule in NEIGHBOURS]


def test_a_decay_to_zero_sized_in_one_epoch_of_accumulated_updates(tmp_path):
    """Accumulation over 4 batches: `len(loader) // accum` is one epoch's optimizer steps, so in
    a 3-epoch run the lr is 0 for the last two. The finding points at the line computing the
    length, and the fix rewrites it over the run with the script's names."""
    f = _one(_accumulated(tmp_path, "len(loader) // accum", 3))
    assert f.evidence["side"] == "ends" and f.location.line == 12
    assert "optimizer steps of one epoch" in f.message and "4 accumulated per step" in f.message
    assert "steps = num_epochs * math.ceil(len(loader) / accum)" in f.fix
    assert [r.location.line for r in f.related][:1] == [13]


@pytest.mark.parametrize("steps, epochs", [
    ("num_epochs * math.ceil(len(loader) / accum)", 3),  # the whole run
    ("len(loader) // accum", 1),  # one epoch's updates in a one-epoch run
])
def test_a_decay_over_the_run_of_accumulated_updates_is_silent(tmp_path, steps, epochs):
    assert _accumulated(tmp_path, steps, epochs) == []


def test_a_whole_run_length_read_from_the_shortened_replay_is_silent(tmp_path):
    """25 batches an epoch, 3 accumulated: the replay's shorter len(loader) gives a whole-run
    length that is also a multiple of the real epoch's updates (18 = 3 x 6 = 2 x 9); a length
    that covers every planned epoch in one reading is sized over the run."""
    assert _accumulated(tmp_path, "num_epochs * math.ceil(len(loader) / accum)", 3, n=100,
                        accum=3) == []
