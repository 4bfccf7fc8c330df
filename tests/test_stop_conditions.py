"""Stop conditions (instrument/stop.py): the step budget, and a loop that never steps ends in
seconds with a verdict instead of running into the time limit. In-process checks."""

from __future__ import annotations

import textwrap

from graddoctor.run.session import run_check
from graddoctor.instrument.stop import NO_STEP_BACKWARDS, NoStepLimit, StepBudget
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


WRAPPED_BASE = """
import torch
torch.manual_seed(0)


class Wrapper(torch.optim.Optimizer):  # SAM's shape: the base optimizer steps, never the wrapper
    def __init__(self, params, **kwargs):
        super().__init__(params, dict(kwargs))
        self.base = torch.optim.SGD(self.param_groups, **kwargs)
        self.param_groups = self.base.param_groups

    def second_step(self):
        self.base.step()


model = torch.nn.Linear(4, 1)
opt = Wrapper(model.parameters(), lr=0.1)
for i in range(200):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.second_step()
    opt.zero_grad()
"""


def test_a_wrapper_whose_base_optimizer_steps_its_parameters_is_not_waited_for(tmp_path):
    report = check(tmp_path, WRAPPED_BASE, steps=3)
    assert report.run.status == "step-limit"
    assert report.run.updates <= 4


class _Rec:
    """What Progress and the conditions read of a recorder."""

    def __init__(self):
        self.opt_params = {1: [0]}
        self.optimizer_id = None  # (read by the budget only for optimizers it waits for: none)
        self.errors = []

    def subscribers(self, topic):
        from graddoctor.instrument.topics import Subscribers
        return Subscribers()

    def internal_error(self, where, exc):
        self.errors.append((where, exc))


class _Counting(NoStepLimit):
    def __init__(self):
        super().__init__(backwards=4)
        self.asked = 0

    def after_backward(self, rec):
        self.asked += 1
        return super().after_backward(rec)


def test_a_condition_that_can_no_longer_answer_is_asked_no_more_and_the_others_still_are():
    from graddoctor.instrument.progress import Progress

    rec = _Rec()
    never, budget = _Counting(), StepBudget(3)
    progress = Progress(rec, None, [never, budget])
    rec.progress = progress
    progress.count_backward()
    assert never.asked == 1
    progress.count_step(1)  # a step: the no-step limit can never answer again
    progress.count_backward()
    assert never.asked == 2  # told SPENT once, then dropped
    for _ in range(10):
        progress.count_backward()
    assert never.asked == 2 and not progress.stop_requested
    progress.count_step(1)
    progress.count_backward()
    progress.count_step(1)  # the third update: the budget still answers
    assert progress.stop_requested and progress._stop[0] is StepBudget.exception
    assert not rec.errors


def test_the_no_step_limit_still_stops_a_loop_that_never_stepped():
    from graddoctor.instrument.progress import Progress

    rec = _Rec()
    progress = Progress(rec, None, [NoStepLimit(backwards=4)])
    rec.progress = progress
    for _ in range(3):
        progress.count_backward()
    assert not progress.stop_requested
    progress.count_backward()
    assert progress.stop_requested
