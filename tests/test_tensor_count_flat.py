"""What graddoctor does per update in Python does not grow with the number of parameter tensors,
inside its first windows (steps 4-12: a tenfold count behind the same module calls, and a budget
per module call for a tenfold number of calls) and past them. Past them: a model with ten times
the tensors runs the same graddoctor bytecodes per step, but for the graph walk of the sampled backwards (``backward._leaves`` / ``_walk``, one visit
per graph node). Per-tensor work belongs in C-level passes (``map``, ``torch._foreach_*``); a
Python loop over the parameters on every step shows up here as soon as it is written. Counted
with ``sys.settrace`` (opcodes do not depend on the machine's load)."""

from __future__ import annotations

import collections
import random
import sys

import torch

from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

GRAPH_WALK = {"_leaves", "_walk"}
WINDOWS_OVER = 40  # steps after which the watchers' early windows have all closed
TRACED = 8


# the early windows (watchers that look at the first 3, 4, 6 or 8 backwards, calls or steps): the
# steps that benchmarks/tensor_count.py times from its fourth step on
WINDOW_STEPS = range(4, 13)
# graddoctor's opcodes a module call nested in the model's may cost per step inside the early
# windows (the dispatch of the global module hooks and the watchers that see every module call:
# about 170 on 2026-12-06); a watcher that looks only at the model's call asks for outermost
# calls (``register_module_hooks(outermost=True)``), one that looks at some classes names them
PER_MODULE_CALL = 220


def _counter(counts: collections.Counter):
    def trace(frame, event, arg):
        code = frame.f_code
        if "graddoctor" not in code.co_filename or code.co_name in GRAPH_WALK:
            return None
        frame.f_trace_opcodes = True
        key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"

        def local(frame, event, arg):
            if event == "opcode":
                counts[key] += 1
            return local
        return local
    return trace


def _opcodes_per_step(tensors: int, model=None,
                      steps=range(WINDOWS_OVER + 1, WINDOWS_OVER + TRACED + 1)) -> collections.Counter:
    """graddoctor's opcodes by function over ``steps`` (counted from 1), the graph walk aside."""
    counts: collections.Counter = collections.Counter()
    trace = _counter(counts)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        torch.manual_seed(0)
        if model is None:
            model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(tensors // 2)))
        else:
            model = model(tensors)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, 4)
        for i in range(1, steps[-1] + 1):
            if i in steps:
                sys.settrace(trace)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            sys.settrace(None)
    return counts


class _Bank(torch.nn.Module):
    """Many small parameters behind one module call and one graph node (``torch.stack``): the
    tensor count grows, the module calls and the graph's depth do not."""

    def __init__(self, tensors: int):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4) * 0.1)
                                         for _ in range(tensors - 2))
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.head(x * torch.stack(tuple(self.ws)).sum(0))


def test_python_work_per_update_is_flat_in_the_tensor_count():
    few, many = _opcodes_per_step(40), _opcodes_per_step(400)
    grown = {key: (few[key] // TRACED, many[key] // TRACED) for key in few.keys() | many.keys()
             if many[key] > few[key] * 1.02 + TRACED * 4}
    assert not grown, f"per-step opcodes (40 tensors, 400 tensors) that grow with the count: {grown}"


def test_python_work_of_the_early_windows_is_flat_in_the_tensor_count():
    """Inside the first windows too (steps 4-12), ten times the tensors behind the same module
    calls and graph depth run the same graddoctor bytecodes per step: what a window looks at per
    tensor it samples (a few of them), or reads in one C pass (``map``s, ``torch._foreach_*``,
    graphpaths.nodes_below's level-by-level walk)."""
    few, many = (_opcodes_per_step(n, _Bank, WINDOW_STEPS) for n in (100, 1000))
    steps = len(WINDOW_STEPS)
    grown = {key: (few[key] // steps, many[key] // steps) for key in few.keys() | many.keys()
             if many[key] > few[key] * 1.02 + steps * 4}
    assert not grown, f"window opcodes per step (100, 1,000 tensors) that grow with the count: {grown}"


def test_python_work_of_the_early_windows_per_module_call_is_bounded():
    """Ten times the module calls (a deeper stack of Linears) cost the early windows at most
    ``PER_MODULE_CALL`` opcodes per extra call and step: no watcher does more than a test or two
    on a module call it does not look at."""
    few, many = (_opcodes_per_step(n, None, WINDOW_STEPS) for n in (40, 400))
    steps, calls = len(WINDOW_STEPS), (400 - 40) // 2  # one Linear call per two tensors
    per_call = (sum(many.values()) - sum(few.values())) / steps / calls
    top = sorted(((many[k] - few[k]) // steps // calls, k) for k in many.keys() | few.keys())[-6:]
    assert per_call <= PER_MODULE_CALL, f"{per_call:.0f} opcodes per module call and step: {top}"


class _Routed(torch.nn.Module):
    """Many small parameters of which each step uses another half (a mixture of experts'
    routing): no two turns alike, so none folds and every turn's shape is a new one."""

    def __init__(self, tensors: int):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4) * 0.1)
                                         for _ in range(tensors))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        chosen = random.Random(self.calls).sample(range(len(self.ws)), len(self.ws) // 2)
        return x * torch.stack([self.ws[i] for i in sorted(chosen)]).sum(0)


def test_python_work_per_update_is_flat_in_the_tensor_count_when_each_turn_differs(monkeypatch):
    """A routed model whose every turn writes another subset of its parameters, past the start
    of the folding: the folder compares and keeps each new turn (its shape, its plan) with C
    passes over the turn's lists of pids, not a Python call per pid."""
    from graddoctor.instrument import fold
    monkeypatch.setattr(fold, "FOLD_AFTER", 8)
    few, many = _opcodes_per_step(40, _Routed), _opcodes_per_step(400, _Routed)
    grown = {key: (few[key] // TRACED, many[key] // TRACED) for key in few.keys() | many.keys()
             if many[key] > few[key] * 1.02 + TRACED * 4}
    assert not grown, f"per-step opcodes (40 tensors, 400 tensors) that grow with the count: {grown}"
