"""bag-offsets-not-cumulative (GD343): the offsets instrument/bagoffsets.py judges at
F.embedding_bag's first calls, and the rule's line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.analysis import Analysis
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.bagoffsets import judge_offsets
from graddoctor.rules import find_rule

SLUG = "bag-offsets-not-cumulative"


def _lengths():
    return torch.tensor([3, 5, 2, 4, 6, 1, 3, 2])


@pytest.mark.parametrize("make, how", [
    (lambda n: torch.cat([n.new_zeros(1), n[:-1]]), "decreasing"),  # the lengths, not their sum
    (lambda n: torch.tensor([0] + [4] * 7), "empty"),  # one size repeated: all but two bags empty
])
def test_offsets_that_are_no_running_starts_are_read(make, how):
    n = _lengths()
    found = judge_offsets(torch.zeros(int(n.sum()), dtype=torch.long), make(n))
    assert found is not None and found["how"] == how and found["bags"] == 8


@pytest.mark.parametrize("make", [
    lambda n: F.pad(n.cumsum(0)[:-1], (1, 0)),
    lambda n: n.cumsum(0) - n,
    lambda n: torch.arange(8) * 3,  # fixed-size bags
    lambda n: torch.tensor([0, 0, 3, 8, 10, 14, 20, 21]),  # one empty bag
])
def test_running_starts_and_a_few_empty_bags_read_as_nothing(make):
    n = _lengths()
    assert judge_offsets(torch.zeros(int(n.sum()), dtype=torch.long), make(n)) is None


def test_a_2d_input_has_no_offsets_to_judge():
    assert judge_offsets(torch.zeros(4, 3, dtype=torch.long), torch.tensor([0, 2])) is None


def test_the_rule_points_at_the_offsets_assignment():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        bag = nn.EmbeddingBag(20, 4)
        opt = torch.optim.SGD(bag.parameters(), lr=0.1)
        for _ in range(3):
            lengths = torch.tensor([3, 5, 2, 4, 6])
            offsets = torch.cat([lengths.new_zeros(1), lengths[:-1]])
            loss = bag(torch.randint(0, 20, (20,)), offsets).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = [e for e in rec.trace if e.kind == "bag_offsets"]
    assert [(e["how"], e["bags"], e["items"]) for e in events] == [("decreasing", 5, 20)]
    [found] = find_rule(SLUG)().check(Analysis(rec.trace))
    assert found.location.line == test_the_rule_points_at_the_offsets_assignment.__code__.co_firstlineno + 8
