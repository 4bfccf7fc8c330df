"""grads-accumulated-across-weight-edit (GD284): a backward that adds onto the gradients of an
earlier one of the same update although the weights were moved in place in between (SAM
without a clear between its two passes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.weightedits import WeightEditWatcher
from rule_traces import builder, findings, only

SLUG = "grads-accumulated-across-weight-edit"


class _Loc:
    def __init__(self, line):
        self.path, self.line = "train.py", line


class _Rec:
    def __init__(self, params):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.events = []
        self.line = 0

    def here(self, skip=2):
        return _Loc(self.line)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        pass


def _sam(clear_between: bool, rho=0.05, steps=3, perturb=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    params = list(model.parameters())
    rec = _Rec(params)
    watcher = WeightEditWatcher(rec, {pid: None for pid in range(len(params))})
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(steps):
        x = torch.randn(16, 4)
        opt.zero_grad()
        loss = F.mse_loss(model(x), x[:, :1])
        rec.line = 10
        watcher.describe_loss(loss)
        loss.backward()
        with torch.no_grad():
            moves = [rho * p.grad / (p.grad.norm() + 1e-12) if perturb else torch.zeros_like(p)
                     for p in params]
            for p, e in zip(params, moves):
                p.add_(e)
        if clear_between:
            opt.zero_grad()
        loss = F.mse_loss(model(x), x[:, :1])
        rec.line = 20
        watcher.describe_loss(loss)
        loss.backward()
        with torch.no_grad():
            for p, e in zip(params, moves):
                p.sub_(e)
        opt.step()
        watcher.after_step(0, opt)
    return rec.events


def test_the_watcher_sees_the_weights_moved_between_two_backwards():
    made = _sam(clear_between=False)
    assert [kind for kind, _ in made] == ["weights_edited"] * 3
    assert made[0][1]["params"] == [0, 1, 2, 3] and made[0][1]["before"] == ["train.py", 10]


def test_the_watcher_is_silent_when_nothing_moved_and_forgets_across_steps():
    assert _sam(clear_between=False, perturb=False) == []  # two passes at the same weights


def _trace(accumulated=True, updates=2, edited=(0, 1)):
    t = builder()
    for _ in range(updates):
        t.clear([0, 1], line=9)
        t.backward(fresh=[0, 1], line=10)
        t.put(ev.weights_edited(params=list(edited), sampled=2, before=["train.py", 10]), line=20)
        if accumulated:
            t.backward(accumulated=[0, 1], line=20)
        else:
            t.clear([0, 1], line=19)
            t.backward(fresh=[0, 1], line=20)
        t.step(0, line=30)
    return t


def test_the_rule_warns_at_the_second_backward():
    f = only(_trace(), SLUG)
    assert f.location.line == 20 and f.evidence["params"] == [0, 1]
    assert "g(w) + g(w + e)" in f.message and "zero_grad" in f.fix
    assert [r.location.line for r in f.related] == [10, 30]


def test_the_rule_is_silent_when_the_second_backward_starts_fresh():
    assert findings(_trace(accumulated=False), SLUG) == []


def test_the_rule_needs_two_updates():
    assert findings(_trace(updates=1), SLUG) == []


def test_the_rule_ignores_parameters_no_optimizer_steps():
    assert findings(_trace(edited=(7, 8)), SLUG) == []


def test_misplaced_zero_grad_takes_a_clear_before_a_pass_at_moved_weights_for_sam():
    t = builder()
    for _ in range(2):
        t.clear([0, 1], line=9)
        t.backward(fresh=[0, 1], line=10)
        t.clear([0, 1], line=15)
        t.put(ev.weights_edited(params=[0, 1], sampled=2, before=["train.py", 10]), line=20)
        t.backward(fresh=[0, 1], line=20)
        t.step(0, line=30)
    assert findings(t, "misplaced-zero-grad") == []


def test_the_rule_points_at_the_call_that_asked_to_keep_the_gradients(tmp_path):
    script = tmp_path / "train.py"
    lines = [""] * 40
    lines[9] = "    loss.backward()"
    lines[14] = "    sam.first_step(zero_grad=False)  # keeps g(w)"
    lines[19] = "    loss_fn(model(x), y).backward()"
    script.write_text("\n".join(lines) + "\n")
    t = builder()
    t.path = str(script)
    for _ in range(2):
        t.clear([0, 1], line=9)
        t.backward(fresh=[0, 1], line=10)
        t.put(ev.weights_edited(params=[0, 1], sampled=2, before=[str(script), 10]), line=20)
        t.backward(accumulated=[0, 1], line=20)
        t.step(0, line=30)
    f = only(t, SLUG)
    assert f.location.line == 15 and [r.location.line for r in f.related] == [20, 10, 30]
