"""anchor-aliases-params (GD263): a penalty's anchor that is the live parameters (an EWC, L2-SP
or FedProx anchor stored without a copy)."""

from __future__ import annotations

import ast

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.anchors import AnchorAliasWatcher
from graddoctor.rules.anchor_aliases_params import anchor_lines
from rule_traces import builder, findings, only

SLUG = "anchor-aliases-params"


class _Rec:
    def __init__(self, params):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.events = []
        self.line = 0

    def here(self, skip=2):
        return ("backward", self.line)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):  # the watcher leaves its topics once done
        pass


def _train(anchor_of, penalty, steps=4, micro=1):
    """The events the watcher records over ``steps`` SGD steps of a small model with the
    penalty ``penalty(p, anchor)`` summed over its parameters."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    rec = _Rec(list(model.parameters()))
    watcher = AnchorAliasWatcher(rec)
    anchor = {n: anchor_of(p) for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(micro):
            x = torch.randn(8, 4)
            loss = F.cross_entropy(model(x), x[:, :3].argmax(1)) + sum(
                penalty(p, anchor[n]) for n, p in model.named_parameters())
            watcher.describe_loss(loss)
            loss.backward()
        opt.step()
        watcher.after_step(0, opt)
    return rec.events


def _square(p, a):
    return ((p - a) ** 2).sum()


def test_the_parameter_objects_as_anchor_are_p_minus_p_at_the_first_backward():
    (kind, data), = _train(lambda p: p, _square, steps=1)
    assert kind == "anchor_alias" and data["how"] == "same" and data["params"] == [0, 1]


def test_an_anchor_sharing_the_parameters_memory_is_found_after_two_steps():
    for anchor_of in (lambda p: p.detach(), lambda p: p.data):
        (kind, data), = _train(anchor_of, _square)
        assert data["how"] == "shared" and data["params"] == [0, 1]
    (kind, data), = _train(lambda p: p.detach(), lambda p, a: F.mse_loss(p, a, reduction="sum"))
    assert data["how"] == "shared"
    (kind, data), = _train(lambda p: p.detach(), lambda p, a: (p - a).abs().sum())
    assert data["how"] == "shared"
    (kind, data), = _train(lambda p: p.detach(), lambda p, a: ((a - p) ** 2).sum())
    assert data["how"] == "shared"


def test_a_distance_and_a_difference_written_twice_are_read_too():
    (kind, data), = _train(lambda p: p.detach(), lambda p, a: torch.dist(p, a))
    assert data["how"] == "shared"
    (kind, data), = _train(lambda p: p.detach(), lambda p, a: ((p - a) * (p - a)).sum())
    assert data["how"] == "shared"
    assert _train(lambda p: p.detach().clone(), lambda p, a: torch.dist(p, a)) == []
    assert _train(lambda p: p.detach().clone(), lambda p, a: ((p - a) * (p - a)).sum()) == []


def test_a_penalty_switched_on_later_on_the_same_backward_line_is_looked_at():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    rec = _Rec(list(model.parameters()))
    watcher = AnchorAliasWatcher(rec)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    anchor = None
    for step in range(10):
        x = torch.randn(8, 4)
        loss = F.cross_entropy(model(x), x[:, :3].argmax(1))
        if step == 6:  # past the first backwards of the line
            anchor = {n: p.detach() for n, p in model.named_parameters()}
        if anchor is not None:
            loss = loss + sum(_square(p, anchor[n]) for n, p in model.named_parameters())
        watcher.describe_loss(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watcher.after_step(0, opt)
    ((kind, data),) = rec.events
    assert data["how"] == "shared" and data["params"] == [0, 1]


def test_a_copied_anchor_is_not():
    assert _train(lambda p: p.detach().clone(), _square) == []
    assert _train(lambda p: p.detach().clone(), lambda p, a: F.mse_loss(p, a, reduction="sum")) == []


def test_a_copied_anchor_of_a_parameter_the_optimizer_leaves_still_is_not():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    rec = _Rec(list(model.parameters()))
    watcher = AnchorAliasWatcher(rec)
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(4):
        loss = model(torch.randn(8, 4)).sum() + sum(_square(p, anchor[n]) for n, p in model.named_parameters())
        watcher.describe_loss(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watcher.after_step(0, opt)
    assert rec.events == []


def test_accumulated_micro_batches_count_once_per_step():
    # a copied anchor is equal to the parameters until the first step: two micro-batches of
    # that first update are one observation, not two
    assert _train(lambda p: p.detach().clone(), _square, steps=2, micro=2) == []


def test_the_anchor_line_is_found_in_the_source():
    text = """
anchor = {n: p.detach() for n, p in model.named_parameters()}
copied = {n: p.detach().clone() for n, p in model.named_parameters()}
params = list(model.parameters())
star = dict(model.named_parameters())
penalty = sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
ewc = sum((p - star[n]).pow(2).sum() for n, p in model.named_parameters())
drift = sum(((p - copied[n]) ** 2).sum() for n, p in model.named_parameters())
pre = {k: v for k, v in model.state_dict().items()}
kept = {k: v.clone() for k, v in model.state_dict().items()}
prox = sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), pre.values()))
prox2 = sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), kept.values()))
"""
    assert anchor_lines(ast.parse(text)) == [(2, "anchor"), (5, "star"), (9, "pre")]


def test_an_anchor_read_by_a_distance_is_an_anchor_line():
    text = """\
start = [p.detach() for p in body.parameters()]
views = [p.detach() for p in body.parameters()]
reg = sum(torch.dist(p, p0) for p, p0 in zip(body.parameters(), start))
print(views)
"""
    assert anchor_lines(ast.parse(text)) == [(1, "start")]


def _trace(params, stepped=(0, 1), how="shared"):
    t = builder(params=list(stepped))
    t.clear(list(stepped), line=10)
    t.put(ev.anchor_alias(params=list(params), how=how), line=11)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_steps_those_parameters():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 11 and f.evidence["params"] == [0, 1] and "clone" in f.fix
    assert "memory" in f.message
    assert "itself" in only(_trace([0], how="same"), SLUG).message


def test_the_rule_is_silent_when_no_optimizer_steps_them():
    assert findings(_trace([5]), SLUG) == []
