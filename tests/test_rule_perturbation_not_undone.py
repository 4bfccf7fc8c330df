"""perturbation-not-undone (GD422): an optimizer step that starts from weights the script moved
in place between two backwards of the update and never moved back (SAM without its restore)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.weightedits import WeightEditWatcher
from rule_traces import builder, findings, only
from test_rule_grads_accumulated_across_weight_edit import _Rec

SLUG = "perturbation-not-undone"


def _sam(restore: bool, steps=3, restore_after_step=False):
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
            moves = [0.05 * p.grad / (p.grad.norm() + 1e-12) for p in params]
            for p, e in zip(params, moves):
                p.add_(e)
        opt.zero_grad()
        loss = F.mse_loss(model(x), x[:, :1])
        rec.line = 20
        watcher.describe_loss(loss)
        loss.backward()
        if restore:
            with torch.no_grad():
                for p, e in zip(params, moves):
                    p.sub_(e)
        rec.line = 30
        watcher.before_step(0, opt)
        opt.step()
        watcher.after_step(0, opt)
        if restore_after_step:
            with torch.no_grad():
                for p, e in zip(params, moves):
                    p.sub_(e)
    return rec.events


def test_the_watcher_sees_the_perturbation_kept_at_the_step():
    made = [(k, d) for k, d in _sam(restore=False) if k == "weights_edit_kept"]
    assert len(made) == 3 and made[0][1]["params"] == [0, 1, 2, 3]
    assert made[0][1]["edited_at"] == ["train.py", 20]


def test_the_watcher_is_silent_when_the_weights_are_restored_before_the_step():
    assert [k for k, _ in _sam(restore=True)] == ["weights_edited"] * 3


def test_a_restore_after_the_step_is_too_late():
    made = [k for k, _ in _sam(restore=False, restore_after_step=True)]
    assert made.count("weights_edit_kept") == 3


def _trace(updates=2):
    t = builder()
    for _ in range(updates):
        t.clear([0, 1], line=9)
        t.backward(fresh=[0, 1], line=10)
        t.put(ev.weights_edited(params=[0, 1], sampled=2, before=["train.py", 10]), line=20)
        t.clear([0, 1], line=19)
        t.backward(fresh=[0, 1], line=20)
        t.put(ev.weights_edit_kept(params=[0, 1], sampled=2, edited_at=["train.py", 20]), line=30)
        t.step(0, line=30)
    return t


def test_the_rule_warns_at_the_step():
    f = only(_trace(), SLUG)
    assert f.location.line == 30 and f.evidence == {"params": [0, 1], "updates": 2}
    assert [r.location.line for r in f.related] == [20] and "w + e" in f.message


def test_the_rule_needs_two_updates():
    assert findings(_trace(updates=1), SLUG) == []


def test_a_restore_defeated_by_an_aliased_copy_is_left_to_the_copy_rule():
    t = _trace()
    t.put(ev.self_copy(params=[0, 1], how=".data =", steps=2), 25)
    assert findings(t, SLUG) == []
    t = _trace()
    t.put(ev.self_copy(params=[0], how=".data =", steps=2), 25)  # one of the two restored
    assert only(t, SLUG).location.line == 30
