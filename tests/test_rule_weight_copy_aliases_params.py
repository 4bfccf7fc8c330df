"""weight-copy-aliases-params (GD283): a weight copy taken without clone() (Lookahead's slow
weights, SAM's saved weights, a best-weights list) written back onto its parameter."""

from __future__ import annotations

import ast

import pytest
import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.patcher import Patcher
from graddoctor.instrument.selfcopy import SelfCopyWatcher
from graddoctor.rules.weight_copy_aliases_params import store_lines
from rule_traces import builder, findings, only

SLUG = "weight-copy-aliases-params"


class _Finder:
    def is_user_file(self, filename):
        return filename == __file__


class _Rec:
    def __init__(self, params):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.finder = _Finder()
        self.events = []

    def here(self, skip=2):
        return ("write", 0)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        pass


@pytest.fixture
def watched():
    """A model's parameters under the watcher's wrappers; the wrappers are put back after."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    params = list(model.parameters())
    rec = _Rec(params)
    watcher = SelfCopyWatcher(rec, {pid: None for pid in range(len(params))})
    patcher = Patcher()
    watcher.install(patcher)
    try:
        yield model, rec, watcher
    finally:
        patcher.undo()


def test_a_copy_of_a_parameters_own_memory_is_seen_for_each_write(watched):
    model, rec, _ = watched
    w = model.weight
    slow = w.data
    with torch.no_grad():
        w.data.copy_(slow)
        w.lerp_(w.detach(), 0.5)  # not watched: torch's Adam calls lerp_ per parameter
        w.data = slow
    assert [d["how"] for _, d in rec.events] == ["copy_", ".data ="]
    assert all(d["params"] == [0] for _, d in rec.events)


def test_copies_and_tied_memory_are_not_seen(watched):
    model, rec, _ = watched
    w = model.weight
    with torch.no_grad():
        w.copy_(w.detach().clone())  # a real copy
        w.data = torch.zeros_like(w)
    assert rec.events == []


def test_a_memory_two_parameters_share_is_left_alone():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight.data = a.weight.data  # tied through .data
    rec = _Rec([a.weight, b.weight])
    watcher = SelfCopyWatcher(rec, {0: None, 1: None})
    patcher = Patcher()
    watcher.install(patcher)
    try:
        b.weight.data = a.weight.data
    finally:
        patcher.undo()
    assert rec.events == []


def test_the_wrappers_go_after_the_window(watched):
    model, rec, watcher = watched
    for _ in range(12):
        watcher.after_step(0, None)
    assert "copy_" not in vars(torch.Tensor) or vars(torch.Tensor)["copy_"] is torch._C.TensorBase.copy_
    w = model.weight
    with torch.no_grad():
        w.copy_(w)
    assert rec.events == []


def test_the_store_line_is_the_uncopied_assignment_the_writer_reads():
    text = """\
class Lookahead:
    def __init__(self, base):
        self.grads = [p.grad.data for p in base.params]
        self.slow = [[p.data for p in g["params"]] for g in base.param_groups]
        self.fast = [p.detach().clone() for p in base.params]

    def step(self):
        for p, q in zip(self.params, self.slow):
            p.data.copy_(q)
"""
    assert store_lines(ast.parse(text), 9) == [(4, "slow")]
    sam = """\
state[p]["old_p"] = p.data
keep = p.data
p.data = state[p]["old_p"]
"""
    assert store_lines(ast.parse(sam), 3) == [(1, "old_p")]
    assert store_lines(ast.parse("best = list(model.parameters())\np.copy_(best[0])\n"), 2) == [(1, "best")]


def _trace(how="copy_", params=(0,)):
    t = builder()
    t.clear([0, 1], line=9)
    t.backward(fresh=[0, 1], line=10)
    t.step(0, line=11)
    t.put(ev.self_copy(params=list(params), how=how, steps=1), line=12)
    return t


def test_the_rule_warns_at_the_write_without_a_source():
    f = only(_trace(), SLUG)
    assert f.location.line == 12 and f.evidence == {"params": [0], "how": "copy_"}
    assert "clone()" in f.fix and "onto itself" in f.message


def test_the_rule_ignores_parameters_no_optimizer_steps():
    assert findings(_trace(params=(5,)), SLUG) == []
