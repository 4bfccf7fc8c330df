"""hook-stacked (GD188): hand-written traces (no torch), and the registration watcher
in-process: the hooks run as without graddoctor, and only a repeated copy that still changes
the value it is given is recorded."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.hookstack import _same
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "hook-stacked"


def stacked(t, updates, api="register_hook"):
    t.param(0, "model.emb.weight", shape=[4, 2])
    t.optimizer(0, [0], line=1)
    t.backward(fresh=[0], line=7)
    t.step(0, line=8)
    t.put(ev.hook_stacked(api=api, target="tensor", pid=0, shape=[4, 2], cls=None, copies=2,
                          updates=updates), 5)
    t.backward(fresh=[0], line=7)
    t.step(0, line=8)


def test_a_copy_registered_at_another_update_is_a_warning_at_the_registration():
    t = TraceBuilder()
    stacked(t, updates=2)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 5
    assert "model.emb.weight" in f.message and "register_hook()" in f.message


def test_copies_registered_within_one_update_are_silent():
    t = TraceBuilder()
    stacked(t, updates=1)
    assert findings(t, SLUG) == []


def _train(register_each_step, steps=4):
    """The embedding-like weight's values after ``steps`` SGD updates with a 0.5 gradient hook
    registered at every update (the bug) or once."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(5, 3)
    if not register_each_step:
        w.register_hook(lambda g: g * 0.5)
    for _ in range(steps):
        if register_each_step:
            w.register_hook(lambda g: g * 0.5)
        optimizer.zero_grad()
        (x @ w).pow(2).sum().backward()
        optimizer.step()
    return w.detach().clone()


def test_the_watcher_records_a_scaling_copy_once_and_changes_no_value():
    expected = _train(register_each_step=True)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        got = _train(register_each_step=True)
    assert torch.equal(got, expected)
    events = [e for e in rec.trace if e.kind == "hook_stacked"]
    assert len(events) == 1
    assert events[0].get("api") == "register_hook" and events[0].get("updates") == 2
    assert events[0].get("copies") == 2
    assert torch.Tensor.register_hook.__module__ != __name__  # the patch is gone
    assert "hookstack" not in torch.Tensor.register_hook.__code__.co_filename


def test_the_watcher_is_silent_on_one_hook_a_removed_one_and_an_idempotent_copy():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _train(register_each_step=False)
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(3):
            handle = layer.weight.register_hook(lambda g: g * 0.5)   # removed each time
            layer.register_forward_hook(lambda m, i, o: o.clamp(-0.1, 0.1))  # idempotent
            layer.bias.register_hook(lambda g: None)  # records nothing, returns nothing
            optimizer.zero_grad()
            layer(torch.randn(4, 3)).sum().backward()
            handle.remove()
            optimizer.step()
    assert [e for e in rec.trace if e.kind == "hook_stacked"] == []


def test_a_forward_pre_hook_and_a_backward_hook_stacked_on_a_module_are_recorded():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model.register_forward_pre_hook(lambda m, args: args[0] * 2)
            model[1].register_full_backward_hook(lambda m, gi, go: tuple(g * 0.5 for g in gi))
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
    apis = sorted(e.get("api") for e in rec.trace if e.kind == "hook_stacked")
    assert apis == ["register_forward_pre_hook", "register_full_backward_hook"]


def test_same_compares_values_not_identity():
    x = torch.ones(2)
    assert _same(x.clone(), x) and not _same(x * 2, x)
    assert _same((x.clone(),), (x,)) and _same(x.clone(), (x,))  # a pre-hook's bare tensor
    assert not _same((x, x), (x,)) and not _same(None if False else x * 0, x)


def _halve_grad(p):
    p.grad.mul_(0.5)


def _halve_output(module, inputs, output):
    output.mul_(0.5)


def test_copies_that_edit_in_place_and_return_nothing_are_recorded():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model[0].weight.register_post_accumulate_grad_hook(_halve_grad)
            model[0].register_forward_hook(_halve_output)
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
    apis = sorted(e.get("api") for e in rec.trace if e.kind == "hook_stacked")
    assert apis == ["register_forward_hook", "register_post_accumulate_grad_hook"]


def test_a_kwargs_pre_hook_returning_its_pair_unchanged_is_silent_and_a_changed_pair_is_not():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model.register_forward_pre_hook(lambda m, args, kwargs: (args, kwargs), with_kwargs=True)
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
        assert [e for e in rec.trace if e.kind == "hook_stacked"] == []
        for _ in range(3):
            model.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] * 2,), kwargs),
                                            with_kwargs=True)
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
    assert [e.get("api") for e in rec.trace if e.kind == "hook_stacked"] == ["register_forward_pre_hook"]
