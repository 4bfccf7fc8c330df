"""Stop conditions (instrument/stop.py): the step budget, and a loop that never steps ends in
seconds with a verdict instead of running into the time limit. In-process checks."""

from __future__ import annotations

import textwrap

from graddoctor.run.session import run_check
from graddoctor.instrument.stop import NO_STEP_BACKWARDS
from graddoctor.options import CheckOptions

NEVER_STEPS = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(10**7):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step   # bug: no call
"""

LONG_ACCUMULATION = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
k = 256
for i in range(3 * k):
    (model(torch.randn(8, 4)).pow(2).mean() / k).backward()
    if (i + 1) % k == 0:
        opt.step()
        opt.zero_grad()
"""

MANUAL_SGD = """
import torch
torch.manual_seed(0)
w = torch.zeros(4, requires_grad=True)
for i in range({n}):
    loss = (torch.randn(8, 4) @ w - 1).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
"""


def check(tmp_path, text, **options):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return run_check(CheckOptions(target=str(path), timeout=120, **options))


def test_a_loop_that_never_steps_is_stopped_after_the_backward_limit(tmp_path):
    report = check(tmp_path, NEVER_STEPS)
    assert report.run.status == "backward-limit"
    assert report.run.steps == 0
    assert report.run.backward_calls == NO_STEP_BACKWARDS
    assert any("never stepped" in note for note in report.run.notes), report.run.notes
    assert not report.could_not_check()


def test_a_long_accumulation_window_reaches_its_steps(tmp_path):
    report = check(tmp_path, LONG_ACCUMULATION, steps=2)
    assert report.run.status == "step-limit"
    assert report.run.steps == 2 and report.run.backward_calls == 2 * 256


def test_hand_written_sgd_without_an_optimizer_is_not_stopped(tmp_path):
    report = check(tmp_path, MANUAL_SGD.format(n=NO_STEP_BACKWARDS + 20), steps=0)
    assert report.run.status == "completed"
    assert report.run.backward_calls == NO_STEP_BACKWARDS + 20


IN_BACKWARD = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(12)])
optimizers = {p: torch.optim.SGD([p], lr=0.01) for p in model.parameters()}
def hook(p):
    optimizers[p].step()
    optimizers[p].zero_grad()
for p in model.parameters():
    p.register_post_accumulate_grad_hook(hook)
for i in range(1000):
    model(torch.randn(8, 4)).pow(2).mean().backward()
"""


def test_the_budget_counts_updates_not_optimizer_calls(tmp_path):
    # 24 optimizers stepped inside each backward: one update per backward
    report = check(tmp_path, IN_BACKWARD, steps=3)
    assert report.run.status == "step-limit"
    assert (report.run.updates, report.run.backward_calls, report.run.steps) == (3, 3, 72)
    assert not report.active()


REBUILT = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
for i in range(1000):
    opt = torch.optim.Adam(model.parameters())
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""

LATER_STAGE = """
import torch
torch.manual_seed(0)
model, head = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
later = torch.optim.SGD(head.parameters(), lr=0.1)  # a later stage, never reached
for i in range(10**6):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


def test_an_optimizer_rebuilt_every_update_is_not_waited_for(tmp_path):
    report = check(tmp_path, REBUILT, steps=3)
    assert report.run.status == "step-limit"
    assert report.run.updates <= 4


def test_an_optimizer_that_never_steps_is_waited_for_a_bounded_time(tmp_path):
    from graddoctor.instrument.stop import HOLD_FACTOR, HOLD_MIN_UPDATES
    report = check(tmp_path, LATER_STAGE, steps=3)
    assert report.run.status == "step-limit"
    assert report.run.updates == max(3 * HOLD_FACTOR, HOLD_MIN_UPDATES)
