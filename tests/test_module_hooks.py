"""The watchers' global module hooks behind one dispatching pair of torch's
(``dependency.ModuleHooks``): the calls each watcher gets are the ones torch's own global hooks
would give it (order, classes, kwargs, a forward that raises, returned values), and the pair
leaves torch's dicts with the last watcher."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_mod

from graddoctor.instrument.dependency import register_module_hooks
from graddoctor.instrument.patcher import Patcher


class _Boom(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def _global_ids():
    return (set(module_mod._global_forward_pre_hooks), set(module_mod._global_forward_hooks),
            set(getattr(module_mod, "_global_forward_hooks_with_kwargs", {})))


def test_each_watcher_gets_its_calls_in_order_and_the_pair_goes_with_the_last():
    before = _global_ids()
    patcher, seen = Patcher(), []
    first = register_module_hooks(patcher, lambda m, a: seen.append(("pre1", type(m).__name__)),
                                  lambda m, a, k, o: seen.append(("post1", type(m).__name__, k)))
    second = register_module_hooks(patcher, None, lambda m, a, o: seen.append(("post2", type(m).__name__)),
                                   with_kwargs=False, always_call=False)
    linear_only = register_module_hooks(patcher, lambda m, a: seen.append(("pre3", type(m).__name__)),
                                        None, classes=nn.Linear)
    after = _global_ids()
    assert len(after[0] - before[0]) == 1 and len(after[1] - before[1]) == 1  # one pair
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model(torch.ones(1, 2))
    assert seen == [("pre1", "Sequential"), ("pre1", "Linear"), ("pre3", "Linear"),
                    ("post1", "Linear", {}), ("post2", "Linear"), ("pre1", "ReLU"),
                    ("post1", "ReLU", {}), ("post2", "ReLU"),
                    ("post1", "Sequential", {}), ("post2", "Sequential")]
    for handle in first + second:
        handle.remove()
        handle.remove()  # again: nothing
    seen.clear()
    model(torch.ones(1, 2))
    assert seen == [("pre3", "Linear")]
    assert _global_ids()[1] == after[1]
    patcher.undo()
    assert _global_ids() == before
    model(torch.ones(1, 2))
    assert seen == [("pre3", "Linear")]


def test_the_raising_forward_calls_only_the_always_call_hooks_without_kwargs():
    patcher, seen = Patcher(), []
    register_module_hooks(patcher, None, lambda m, a, *rest: seen.append(("always", len(rest))))
    register_module_hooks(patcher, None, lambda m, a, *rest: seen.append(("not", len(rest))),
                          always_call=False)
    try:
        with pytest.raises(ValueError):
            _Boom()(torch.ones(1))
        assert seen == [("always", 1)]
    finally:
        patcher.undo()


def test_returned_values_replace_the_args_and_the_output_as_torch_does():
    patcher = Patcher()
    register_module_hooks(patcher, lambda m, a: a[0] * 2, None, classes=nn.Identity)
    register_module_hooks(patcher, None, lambda m, a, k, o: o + 1, classes=nn.Identity)
    register_module_hooks(patcher, None, lambda m, a, k, o: o * 10, classes=nn.Identity)
    try:
        assert float(nn.Identity()(torch.tensor(1.0))) == 30.0
        assert float(nn.ReLU()(torch.tensor(1.0))) == 1.0
    finally:
        patcher.undo()


def test_an_outermost_watcher_gets_only_the_calls_no_other_call_runs_around():
    patcher, seen = Patcher(), []
    register_module_hooks(patcher, lambda m, a: seen.append(("pre", type(m).__name__)),
                          lambda m, a, *rest: seen.append(("post", type(m).__name__)), outermost=True)
    register_module_hooks(patcher, None, lambda m, a, o: seen.append(("every", type(m).__name__)),
                          with_kwargs=False, classes=nn.ReLU)
    try:
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        model(torch.ones(1, 2))
        nn.ReLU()(torch.ones(1))  # a call of its own: outermost too
        assert seen == [("pre", "Sequential"), ("every", "ReLU"), ("post", "Sequential"),
                        ("pre", "ReLU"), ("post", "ReLU"), ("every", "ReLU")]  # in order
        seen.clear()
        with pytest.raises(ValueError):  # a forward that raised still ends its call
            nn.Sequential(nn.Identity(), _Boom())(torch.ones(1))
        model(torch.ones(1, 2))
        assert seen == [("pre", "Sequential"), ("post", "Sequential"),
                        ("pre", "Sequential"), ("every", "ReLU"), ("post", "Sequential")]
    finally:
        patcher.undo()
