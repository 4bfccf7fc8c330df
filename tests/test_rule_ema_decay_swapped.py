"""ema-decay-swapped (GD184): hand-written ``model_copy`` events over scripts written to a
temporary folder (the rule finds the copy's update in the source), and the copies watcher's
measure of how far a copy moves toward the model."""

from __future__ import annotations

import textwrap

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.copies import CopyWatcher
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "ema-decay-swapped"

SCRIPT = """\
import copy
student = make()
teacher = copy.deepcopy(student)
opt = torch.optim.SGD(student.parameters(), lr=0.1)
for step in range(10):
    with torch.no_grad():
        y = teacher(x)
    loss = ((student(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for t, s in zip(teacher.parameters(), student.parameters()):
            t.mul_(0.01).add_(s, alpha=0.99)
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, shares, cos=1.0, pulls=(), targets=9):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=4)
    for _ in range(len(shares) + 1):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    follows = [[i + 2, share, cos] for i, share in enumerate(shares)]
    t.put(ev.model_copy(copy="teacher", model="student", opt=0, params=4, equal=True,
                        forwards=targets, targets=targets, written=True, written_step=2,
                        measured=len(shares), pulls=[list(p) for p in pulls], follows=follows), 7)
    return t


def test_a_copy_moving_most_of_the_way_at_every_update_is_a_warning_at_its_update(tmp_path):
    f = only(_trace(_script(tmp_path), [0.99] * 6), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert "99.0% of the way" in f.message and "teacher" in f.message
    assert "t.mul_(d).add_(p, alpha=1 - d)" in f.fix


def test_an_ema_moving_its_small_share_is_silent(tmp_path):
    assert findings(_trace(_script(tmp_path), [0.01] * 6), SLUG) == []
    assert findings(_trace(_script(tmp_path), [0.7] * 6), SLUG) == []


def test_a_full_copy_at_every_update_is_silent(tmp_path):
    assert findings(_trace(_script(tmp_path), [1.0] * 6), SLUG) == []
    assert findings(_trace(_script(tmp_path), [0.99999] * 6), SLUG) == []


def test_a_decay_warming_up_is_silent_and_a_swapped_one_is_not(tmp_path):
    path = _script(tmp_path)
    letting_go = [0.9995, 0.999, 0.9985, 0.998, 0.9975, 0.997]  # ultralytics' ramp, correct
    assert findings(_trace(path, letting_go), SLUG) == []
    holding_on = list(reversed(letting_go))  # the same ramp with its weights swapped
    assert only(_trace(path, holding_on), SLUG).location.line == 12


def test_the_latest_moves_are_judged_after_an_early_warm_up(tmp_path):
    path = _script(tmp_path)
    assert only(_trace(path, [0.3, 0.5, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95]), SLUG)
    assert findings(_trace(path, [0.95, 0.95, 0.95, 0.95, 0.95, 0.5]), SLUG) == []


def test_too_few_moves_or_moves_away_from_the_model_are_silent(tmp_path):
    path = _script(tmp_path)
    assert findings(_trace(path, [0.99, 0.99]), SLUG) == []
    assert findings(_trace(path, [0.99] * 6, cos=0.5), SLUG) == []


def test_a_model_reset_to_its_copy_is_left_to_copy_never_follows(tmp_path):
    path = _script(tmp_path)
    lookahead = [(4, 1.0, 1.0, True)]  # the model moved onto the copy: slow weights
    assert findings(_trace(path, [0.99] * 6, pulls=lookahead), SLUG) == []
    unrelated = [(4, 0.2, 0.01, True)]
    assert only(_trace(path, [0.99] * 6, pulls=unrelated), SLUG)


def test_the_write_is_reported_rather_than_another_call_on_the_copy(tmp_path):
    text = SCRIPT.replace("    with torch.no_grad():\n        y = teacher(x)",
                          "    teacher.apply(init_hooks)\n    with torch.no_grad():\n        y = teacher(x)")
    path = _script(tmp_path, text)
    assert only(_trace(path, [0.99] * 6), SLUG).location.line == 13


def test_without_an_update_in_the_training_loop_nothing_is_reported(tmp_path):
    built_only = SCRIPT.split("    with torch.no_grad():\n        for t")[0]
    assert findings(_trace(_script(tmp_path, built_only), [0.99] * 6), SLUG) == []


def test_a_copy_used_for_evaluation_only_says_so(tmp_path):
    f = only(_trace(_script(tmp_path), [0.99] * 6, targets=0), SLUG)
    assert "no average of the model" in f.message


class _Pair:
    def __init__(self):
        self.follows = []


def test_the_watcher_measures_the_share_of_the_way_to_the_model():
    model_post = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    copy_post = torch.zeros(3, dtype=torch.float64)
    pair = _Pair()
    CopyWatcher._follow(pair, 3, model_post, copy_post, copy_post.lerp(model_post, 0.99))
    CopyWatcher._follow(pair, 4, model_post, copy_post, copy_post.lerp(model_post, 0.01))
    CopyWatcher._follow(pair, 5, model_post, copy_post, copy_post.clone())  # did not move
    sideways = torch.tensor([0.0, 3.0, -2.0], dtype=torch.float64)  # orthogonal to the way
    CopyWatcher._follow(pair, 6, model_post, copy_post, sideways)
    assert [row[0] for row in pair.follows] == [3, 4, 6]
    assert abs(pair.follows[0][1] - 0.99) < 1e-6 and abs(pair.follows[1][1] - 0.01) < 1e-6
    assert abs(pair.follows[0][2] - 1.0) < 1e-6 and abs(pair.follows[2][2]) < 1e-6


FOREACH = """\
import copy
student = make()
teacher = copy.deepcopy(student)
opt = torch.optim.SGD(student.parameters(), lr=0.1)
t_params = list(teacher.parameters())
for step in range(10):
    with torch.no_grad():
        y = teacher(x)
    loss = ((student(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        torch._foreach_mul_(t_params, 0.01)
        torch._foreach_add_(t_params, list(student.parameters()), alpha=0.99)
"""


def test_a_multi_tensor_update_is_found_through_the_names_bound_to_the_copy(tmp_path):
    f = only(_trace(_script(tmp_path, FOREACH), [0.99] * 6), SLUG)
    assert f.location.line == 12
    unbound = FOREACH.replace("torch._foreach_mul_(t_params", "torch._foreach_mul_(other")
    unbound = unbound.replace("torch._foreach_add_(t_params", "torch._foreach_add_(other")
    assert findings(_trace(_script(tmp_path, unbound), [0.99] * 6), SLUG) == []
