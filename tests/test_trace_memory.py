"""What the trace holds per turn of a loop whose turns never fold: a routed model (a mixture of
experts), where every turn writes another subset of the parameters. Each such turn stays in the
trace whole, so its bytes are the run's growth: the lists of pids its events hold are the bulk
(the backward's ``fresh``, the clip's ``params`` and ``with_grad``, the step's ``without_grad``),
and a list equal to one the trace already holds is held once (``Recorder.same_list``), each pid
as its own int object (``Identities.ints``). Measured by walking the objects the events hold
(``sys.getsizeof``), which does not depend on the machine's load."""

from __future__ import annotations

import gc
import random
import sys
from types import MappingProxyType

import torch

from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder
from graddoctor.trace import Event

TENSORS = 1000
WALKED = range(41, 57)  # turns past the watchers' early windows (counted from 1)
# bytes a routed turn may add to the trace: its two routed subsets (the backward's fresh, the
# step's without_grad: one pointer per owned tensor between them) and its five events with their
# small values (≈ 2.3 KB), with room; 2026-12-07: 10.6 KB at 1,000 tensors (33.4 KB before
# equal lists were held once and pids kept their own int objects)
PER_TURN = TENSORS * 8 * 1.1 + 4096


def _held(obj, seen: set) -> int:
    """The bytes of ``obj`` and of what it holds that ``seen`` does not (each object once)."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        kind = type(o)
        if kind in (list, tuple, set, frozenset):
            stack.extend(o)
        elif kind is dict:
            stack.extend(o)
            stack.extend(o.values())
        elif kind is MappingProxyType:
            stack.extend(gc.get_referents(o))  # the event's own dict
        elif kind is Event:
            stack.extend((o.loc, o.data))
    return total


class _Routed(torch.nn.Module):
    """Many small parameters of which each turn uses another half, at random: no two turns
    alike, so none folds."""

    def __init__(self, tensors: int):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4) * 0.1)
                                         for _ in range(tensors))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        chosen = random.Random(self.calls).sample(range(len(self.ws)), len(self.ws) // 2)
        return x * torch.stack([self.ws[i] for i in sorted(chosen)]).sum(0)


def routed_turn_bytes(tensors: int = TENSORS, turns=WALKED) -> float:
    """The bytes the trace grows by per turn of a routed loop (zero_grad, backward, clip, step)
    over ``turns``: what the events of those turns hold that no earlier event holds."""
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = _Routed(tensors)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, 4)
        for i in range(1, turns[-1] + 1):
            if i == turns[0]:
                first = len(rec.trace.events)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        last = len(rec.trace.events)  # (the end of the run adds its ``param`` events)
    events = rec.trace.events
    assert {e.kind for e in events[first:last]} == {"clear", "backward", "clip", "step_begin", "step"}
    seen: set = set()
    for event in events[:first]:
        _held(event, seen)
    for pids in rec.opt_params.values():  # the optimizer's own list (zero_grad's params)
        _held(pids, seen)
    return sum(_held(event, seen) for event in events[first:last]) / len(turns)


def test_a_routed_turn_holds_its_routed_subsets_once():
    per_turn = routed_turn_bytes()
    assert per_turn <= PER_TURN, (
        f"{per_turn:.0f} bytes a routed turn at {TENSORS} tensors (budget {PER_TURN:.0f}): a list "
        "an event holds is a copy of one the trace has, or holds new int objects for its pids")


def test_same_list_hands_back_an_equal_list_held_before_and_otherwise_a_copy():
    from graddoctor.instrument import recorder as recorder_module

    rec = Recorder(step_budget=None)
    first = list(range(300, 340))
    held = rec.same_list(first)
    assert held == first and held is not first  # a copy, sized to its length
    assert rec.same_list(list(range(300, 340))) is held
    other = rec.same_list(list(range(301, 341)))  # same length, other values
    assert other == list(range(301, 341)) and other is not held
    assert rec.same_list(list(range(300, 340))) is held  # both kept for their length
    # at most SAME_LISTS_PER_LENGTH lists per length, newest first: the oldest is let go
    for start in range(400, 400 + recorder_module.SAME_LISTS_PER_LENGTH):
        rec.same_list(list(range(start, start + 40)))
    assert rec.same_list(list(range(301, 341))) is not other
    # at most SAME_LIST_LENGTHS lengths: the one met longest ago is let go
    kept = rec.same_list(list(range(1000, 1100)))
    for n in range(1, recorder_module.SAME_LIST_LENGTHS + 1):
        rec.same_list(list(range(2000, 2000 + n)))
    assert len(rec._same_lists) <= recorder_module.SAME_LIST_LENGTHS
    assert rec.same_list(list(range(1000, 1100))) is not kept
