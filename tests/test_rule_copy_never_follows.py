"""copy-never-follows (GD153): hand-written ``model_copy`` events over scripts written to a
temporary folder (the rule reads what the script's source can write), and the source reading
(``copy_writers``) on its own."""

from __future__ import annotations

import textwrap

from graddoctor import events as ev
from graddoctor.analysis.source import copy_writers
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "copy-never-follows"

UNCALLED = """\
import copy
student = make()
teacher = copy.deepcopy(student)
opt = torch.optim.SGD(student.parameters(), lr=0.1)
def update_teacher(d=0.99):
    for t, s in zip(teacher.parameters(), student.parameters()):
        t.mul_(d).add_(s, alpha=1 - d)
for step in range(10):
    with torch.no_grad():
        y = teacher(x)
    loss = ((student(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, copy="teacher", model="student", written=False, equal=True, targets=9,
           pulls=(), steps=10, step_line=12, forward_line=10, edits=None):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=4)
    for _ in range(steps):
        t.backward(fresh=P, line=step_line)
        t.step(line=step_line)
    if edits is not None:
        t.put(ev.step_edit(opt=0, steps=[2, 3, 4, 5], back=[0.1] * 4, share=[0.01] * 4,
                           home=edits, home_share=[0.01] * 4), step_line)
    t.put(ev.model_copy(copy=copy, model=model, opt=0, params=4, equal=equal, forwards=targets,
                        targets=targets, written=written, written_step=None, measured=steps - 1,
                        pulls=[list(p) for p in pulls]), forward_line)
    return t


def test_an_update_function_nothing_calls_is_a_warning_at_its_definition(tmp_path):
    f = only(_trace(_script(tmp_path, UNCALLED)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert "update_teacher()" in f.message and "calls it" in f.message


def test_silent_once_the_update_is_called_even_every_n_steps(tmp_path):
    called = UNCALLED + "    if step % 1000 == 999:\n        update_teacher()\n"
    assert findings(_trace(_script(tmp_path, called)), SLUG) == []


def test_silent_when_the_copy_changed_differs_from_the_model_or_makes_no_targets(tmp_path):
    path = _script(tmp_path, UNCALLED)
    assert findings(_trace(path, written=True), SLUG) == []
    assert findings(_trace(path, equal=False), SLUG) == []  # a pretrained teacher
    assert findings(_trace(path, targets=0), SLUG) == []
    assert findings(_trace(path, steps=1), SLUG) == []


NEVER = """\
import copy
q_net = make()
target_net = copy.deepcopy(q_net)
opt = torch.optim.Adam(q_net.parameters())
{setting}
for step in range(10):
    with torch.no_grad():
        y = r + 0.9 * target_net(s2).max(1).values
    loss = ((q_net(s) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_a_follower_nothing_writes_is_a_warning_with_an_unused_sync_setting_else_info(tmp_path):
    path = _script(tmp_path, NEVER.format(setting="SYNC_EVERY = 100"))
    f = only(_trace(path, copy="target_net", model="q_net", step_line=10, forward_line=8), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "SYNC_EVERY" in f.message
    path = _script(tmp_path, NEVER.format(setting="gamma = 0.9"), "other.py")
    f = only(_trace(path, copy="target_net", model="q_net", step_line=10, forward_line=8), SLUG)
    assert f.severity is Severity.INFO


def test_silent_on_a_reference_copy_and_on_a_copy_the_loop_writes(tmp_path):
    ref = NEVER.format(setting="SYNC_EVERY = 100").replace("target_net", "ref_net")
    path = _script(tmp_path, ref)
    assert findings(_trace(path, copy="ref_net", model="q_net", step_line=10), SLUG) == []
    synced = NEVER.format(setting="") + "    if step % 500 == 0:\n        target_net.load_state_dict(q_net.state_dict())\n"
    path = _script(tmp_path, synced, "synced.py")
    assert findings(_trace(path, copy="target_net", model="q_net", step_line=10), SLUG) == []


BACKWARDS = """\
import copy
critic = make()
critic_target = copy.deepcopy(critic)
opt = torch.optim.Adam(critic.parameters())
for step in range(10):
    with torch.no_grad():
        y = critic_target(s2)
    loss = ((critic(s) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 3 == 0:
        for p, tp in zip(critic.parameters(), critic_target.parameters()):
            p.data.copy_(tp.data)
"""


def test_the_model_pulled_toward_a_copy_that_stays_put_is_a_warning_at_the_write(tmp_path):
    path = _script(tmp_path, BACKWARDS)
    pulls = [(3, 1.0, 1.0, False), (6, 0.999, 1.0, False)]
    f = only(_trace(path, copy="critic_target", model="critic", pulls=pulls, step_line=9), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "wrong way round" in f.message


def test_silent_on_one_pull_a_copy_that_moves_too_and_what_params_reset_reports(tmp_path):
    path = _script(tmp_path, BACKWARDS)
    kw = dict(copy="critic_target", model="critic", step_line=9)
    assert findings(_trace(path, pulls=[(3, 1.0, 1.0, False)], **kw), SLUG) == []
    lookahead = [(3, 1.0, 1.0, True), (6, 1.0, 1.0, True)]  # the slow weights moved first
    assert findings(_trace(path, pulls=lookahead, **kw), SLUG) == []
    pulls = [(3, 1.0, 0.01, False), (6, 1.0, 0.01, False)]
    assert findings(_trace(path, pulls=pulls, edits=[1.0] * 4, **kw), SLUG) == []
    assert only(_trace(path, pulls=pulls, edits=[1.0, 1.0, 0.2, 1.0], **kw), SLUG)


def test_copy_writers_follows_functions_given_the_copy(tmp_path):
    text = """\
    teacher = copy.deepcopy(student)
    def blend(dst, src):
        for a, b in zip(dst.parameters(), src.parameters()):
            a.lerp_(b, 0.01)
    def score(model, x):
        return model(x).mean()
    score(teacher, x)
    blend(student, teacher)
    """
    said = copy_writers(_script(tmp_path, text), "teacher")
    assert said["writers"] == [] and said["uncalled"] == []  # blend writes its first argument only
    said = copy_writers(_script(tmp_path, text + "blend(teacher, student)\n", "b.py"), "teacher")
    assert said["writers"] == [9]
    said = copy_writers(_script(tmp_path, text + "ema_update(teacher, student)\n", "c.py"), "teacher")
    assert said["writers"] == [9]  # a function of another file may write it
