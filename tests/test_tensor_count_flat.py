"""Past its first windows, what graddoctor does per update in Python does not grow with the number
of parameter tensors: a model with ten times the tensors runs the same graddoctor bytecodes per
step, but for the graph walk of the sampled backwards (``backward._leaves`` / ``_walk``, one visit
per graph node). Per-tensor work belongs in C-level passes (``map``, ``torch._foreach_*``); a
Python loop over the parameters on every step shows up here as soon as it is written. Counted
with ``sys.settrace`` (opcodes do not depend on the machine's load)."""

from __future__ import annotations

import collections
import sys

import torch

from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

GRAPH_WALK = {"_leaves", "_walk"}
WINDOWS_OVER = 40  # steps after which the watchers' early windows have all closed
TRACED = 8


def _opcodes_per_step(tensors: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

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

    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(tensors // 2)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, 4)
        for i in range(WINDOWS_OVER + TRACED):
            if i >= WINDOWS_OVER:
                sys.settrace(trace)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            sys.settrace(None)
    return counts


def test_python_work_per_update_is_flat_in_the_tensor_count():
    few, many = _opcodes_per_step(40), _opcodes_per_step(400)
    grown = {key: (few[key] // TRACED, many[key] // TRACED) for key in few.keys() | many.keys()
             if many[key] > few[key] * 1.02 + TRACED * 4}
    assert not grown, f"per-step opcodes (40 tensors, 400 tensors) that grow with the count: {grown}"
