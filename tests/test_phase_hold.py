"""The step budget of a loop without a DataLoader waits for the end of the first pass of the loop
around the training loop, or for its first evaluation (instrument/phases.py): bugs that live
there (an evaluation that leaves the model in eval mode) are seen; loops with nothing to wait for
stop at the budget as before. In-process checks."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.instrument import phases
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

HEAD = """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(640, 8)
Y = X.sum(1, keepdim=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""

EPOCHS_EVAL_FORGETS_TRAIN = HEAD + """
def evaluate():
    model.eval()
    with torch.no_grad():
        return nn.functional.mse_loss(model(X[:64]), Y[:64]).item()

model.train()
for epoch in range(3):
    for i in range(0, len(X), 32):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
        opt.step()
    evaluate()
"""

STEPS_EVAL_EVERY_15 = HEAD + """
def validate():
    model.eval()
    with torch.no_grad():
        nn.functional.mse_loss(model(X[:64]), Y[:64]).item()

model.train()
for step in range(1000):
    i = (step * 32) % 640
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
    if (step + 1) % 15 == 0:
        validate()
"""

ONE_LOOP_NOTHING_AFTER = HEAD + """
for step in range(10 ** 6):
    i = (step * 32) % 640
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
"""

LONG_EPOCHS = HEAD + """
for epoch in range(3):
    for i in range(100000):
        j = (i * 32) % 640
        opt.zero_grad()
        nn.functional.mse_loss(model(X[j:j + 32]), Y[j:j + 32]).backward()
        opt.step()
"""

WHILE_EPOCHS_HELPER = HEAD + """
def train_one_epoch():
    for i in range(0, len(X), 40):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[i:i + 40]), Y[i:i + 40]).backward()
        opt.step()

epoch = 0
while epoch < 3:
    train_one_epoch()
    model.eval()
    epoch += 1
"""

STAGE_SWITCH = HEAD + """
for step in range(1000):
    i = (step * 32) % 640
    if step == 25:
        for group in opt.param_groups:
            group["lr"] = 0.001
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
"""

RARE_EVALUATION = HEAD + """
model.train()
for step in range(10 ** 6):
    i = (step * 32) % 640
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
    if step > 0 and step % 100000 == 0:
        model.eval()
"""


def check(tmp_path, text, **options):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return run_check(CheckOptions(target=str(path), timeout=120, **options))


def slugs(report):
    return {f.rule for f in report.findings}


def test_the_budget_waits_for_the_next_epoch_and_sees_the_forgotten_train(tmp_path):
    report = check(tmp_path, EPOCHS_EVAL_FORGETS_TRAIN)
    assert report.run.status == "step-limit"
    assert report.run.updates == 21  # 20 updates of epoch 0, then one of epoch 1
    found = [f for f in report.findings if f.rule == "train-in-eval-mode"]
    assert found and found[0].location.line == 11  # model.eval() in evaluate()


def test_the_budget_waits_for_the_first_evaluation_of_a_single_loop(tmp_path):
    report = check(tmp_path, STEPS_EVAL_EVERY_15)
    assert report.run.updates == 16  # the evaluation after update 15, then one more
    assert "train-in-eval-mode" in slugs(report)


def test_a_loop_with_nothing_after_it_stops_at_the_budget(tmp_path):
    report = check(tmp_path, ONE_LOOP_NOTHING_AFTER)
    assert report.run.updates == 10
    assert not any("replay" in n and "before" in n for n in report.run.notes), report.run.notes


def test_a_pass_longer_than_the_cap_is_not_waited_for_and_said(tmp_path):
    report = check(tmp_path, LONG_EPOCHS)
    assert report.run.updates == 10
    assert any("first pass of the loop at" in n and "longer than its cap" in n
               for n in report.run.notes), report.run.notes


def test_a_while_loop_counted_up_around_a_training_function(tmp_path):
    report = check(tmp_path, WHILE_EPOCHS_HELPER)
    assert report.run.updates == 17  # 16 updates of the first epoch, one of the second
    assert "train-in-eval-mode" in slugs(report)


def test_the_cap_ends_a_wait_for_an_evaluation_that_never_comes(tmp_path, monkeypatch):
    monkeypatch.setattr(phases, "PHASE_UPDATES", 30)
    report = check(tmp_path, RARE_EVALUATION)
    assert report.run.updates == 30
    assert any("first evaluation" in n and "cap of 30 updates" in n for n in report.run.notes), \
        report.run.notes


def test_steps_zero_and_large_budgets_are_left_alone(tmp_path):
    report = check(tmp_path, EPOCHS_EVAL_FORGETS_TRAIN, steps=0)
    assert report.run.status == "completed"
    assert report.run.updates == 60


@pytest.mark.parametrize("src, expected", [
    ("for e in range(3):\n    pass\n", "e"),
    ("for e, (x, y) in enumerate(z):\n    pass\n", "e"),
    ("while k < 3:\n    for i in range(4):\n        j += 1\n    k += 1\n", "k"),
    ("while True:\n    pass\n", None),
])
def test_the_counter_of_an_outer_loop(src, expected):
    loop = ast.parse(src).body[0]
    inner = next((n for n in loop.body if isinstance(n, ast.For)), None)
    assert phases._counter(loop, inner) == expected


def test_the_evaluation_site_is_followed_through_the_script_functions():
    tree = ast.parse(textwrap.dedent("""
        def inner():
            model.eval()
        def outer():
            inner()
        for step in range(9):
            opt.step()
            if step % 3 == 0:
                outer()
    """))
    loop = tree.body[-1]
    assert phases._evaluation_site(loop, tree) == 9
    assert phases._evaluation_site(ast.parse("for s in r:\n    opt.step()\n").body[0], tree) is None
    assert phases._eval_calls(ast.parse("net.train(False)\nnet.train()\nnet.eval()\n")) == [1, 3]


def test_a_loop_of_the_caller_that_runs_the_check_in_process_is_not_the_script(tmp_path):
    reports = []
    for _ in range(1):  # a loop around run_check: the frames above the script are not its loops
        reports.append(check(tmp_path, ONE_LOOP_NOTHING_AFTER))
    assert reports[0].run.updates == 10 and not reports[0].run.notes


def test_a_stage_switch_on_the_loop_counter_is_waited_for(tmp_path):
    report = check(tmp_path, STAGE_SWITCH)
    assert report.run.updates == 27  # the switch at step 25, the counter past it at 26
    assert any("stage switch at" in n for n in report.run.notes), report.run.notes


def test_a_stage_switch_past_the_cap_is_not_waited_for():
    tree = ast.parse("for step in range(10 ** 6):\n    if step == 5000:\n        pass\n    opt.step()\n")

    class Frame:
        f_locals = {"step": 9}
        f_globals: dict = {}

    assert phases._stage_switch(tree.body[0], Frame, 10) is None
    tree = ast.parse("for step in range(10 ** 6):\n    if step >= 50:\n        pass\n    opt.step()\n")
    assert phases._stage_switch(tree.body[0], Frame, 10) == (2, "step", 50)


TASKS_IN_SEQUENCE = HEAD + """
def train(steps, scale=1.0):
    for step in range(steps):
        i = (step * 32) % 640
        opt.zero_grad()
        nn.functional.mse_loss(model(X[i:i + 32]), scale * Y[i:i + 32]).backward()
        opt.step()

train(20)
model.eval()
train(20, scale=2.0)
"""

ONE_CALL = HEAD + """
def train(steps):
    for step in range(steps):
        i = (step * 32) % 640
        opt.zero_grad()
        nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
        opt.step()

train(40)
"""


def test_the_budget_waits_for_a_later_call_of_the_training_function(tmp_path):
    report = check(tmp_path, TASKS_IN_SEQUENCE)
    assert report.run.updates == 30  # the 20 updates of the first task, then 10 of the second
    assert "train-in-eval-mode" in slugs(report)  # what the second task's call inherits
    assert any("later phase of the script at" in n for n in report.run.notes), report.run.notes
    assert not any("before a later phase" in n for n in report.run.notes), report.run.notes


TEACHER_THEN_STUDENT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
X = torch.randn(640, 8)
Y = (X.sum(1) > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
teacher = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
student = nn.Linear(8, 2)
opt_t = torch.optim.SGD(teacher.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        opt_t.zero_grad()
        nn.functional.cross_entropy(teacher(x), y).backward()
        opt_t.step()
opt_s = torch.optim.SGD(student.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        with torch.no_grad():
            soft = teacher(x).softmax(1)
        loss = -(soft * student(x).log_softmax(1)).sum(1).mean()
        loss.backward()  # no zero_grad: the student's gradients pile up
        opt_s.step()
"""

PRETRAIN_THEN_HEAD = HEAD + """
for step in range(30):
    i = (step * 32) % 640
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
head = nn.Linear(1, 1)
opt_head = torch.optim.SGD(head.parameters(), lr=0.01)
for step in range(30):
    i = (step * 32) % 640
    with torch.no_grad():
        z = model(X[i:i + 32])
    opt_head.zero_grad()
    nn.functional.mse_loss(head(z), Y[i:i + 32]).backward()
    opt_head.step()
"""

LONG_LOOP_THEN_MORE = HEAD + """
for step in range(100000):
    i = (step * 32) % 640
    opt.zero_grad()
    nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()
for step in range(30):
    opt.zero_grad()
    nn.functional.mse_loss(model(X[:32]), Y[:32]).backward()
    opt.step()
"""


def test_a_student_trained_after_its_teacher_is_reached_past_the_dataloader_epochs(tmp_path):
    report = check(tmp_path, TEACHER_THEN_STUDENT)
    found = [f for f in report.findings if f.rule == "missing-zero-grad"]
    assert found and found[0].location.line == 23, [(f.rule, f.location) for f in report.findings]
    assert not any("before a later phase" in n for n in report.run.notes), report.run.notes


def test_a_later_training_loop_gets_as_many_updates_as_the_budget(tmp_path):
    report = check(tmp_path, PRETRAIN_THEN_HEAD)
    assert report.run.status == "step-limit"
    assert report.run.updates == 40  # 30 updates of pre-training, then 10 of the head
    assert not report.findings, [(f.rule, f.location) for f in report.findings]


def test_a_loop_too_long_to_finish_within_the_cap_is_not_waited_through(tmp_path):
    report = check(tmp_path, LONG_LOOP_THEN_MORE)
    assert report.run.updates == 10
    assert [n for n in report.run.notes if "later phase" in n] == \
        [n for n in report.run.notes if "before a later phase of the script ran" in n], report.run.notes
    assert any("before a later phase of the script ran" in n for n in report.run.notes)


def test_a_single_call_of_the_training_function_stops_at_the_budget(tmp_path):
    assert check(tmp_path, ONE_CALL).run.updates == 10
