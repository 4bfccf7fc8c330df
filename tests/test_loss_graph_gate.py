"""The loss-graph readers' gate (``lossterms.PerLine``, ``LossGraphReader.describe_loss``): a
run's later backwards are turned away without a pass over the lines or a Location hash, and the
decisions are those of the plain definition."""

from __future__ import annotations

import random

from graddoctor.instrument.lossterms import LossGraphReader, PerLine
from graddoctor.trace import Location


def test_exhausted_is_the_plain_definition_on_random_admissions():
    rng = random.Random(0)
    for _ in range(200):
        per_line, lines = rng.randint(1, 4), rng.randint(1, 5)
        gate = PerLine(per_line, lines)
        for _ in range(40):
            gate.admit(rng.randint(0, 7))
            plain = len(gate.seen) >= lines and all(n >= per_line for n in gate.seen.values())
            assert gate.exhausted == plain


class _Rec:
    def __init__(self, loc):
        self.loc = loc

    def here(self):
        return self.loc

    def internal_error(self, where, exc):
        raise AssertionError(exc)


class _Reader(LossGraphReader):
    per_line, lines = 2, 16

    def __init__(self, rec):
        super().__init__(rec)
        self.judged = []

    def _judge(self, root, loc):
        self.judged.append(loc)


def test_a_line_looked_at_per_line_times_is_shut_and_another_line_still_admitted():
    import torch

    w = torch.randn(3, requires_grad=True)
    first, second = Location("train.py", 10), Location("train.py", 20)
    rec = _Rec(first)
    reader = _Reader(rec)
    for _ in range(5):
        reader.describe_loss((w * 2).sum())
    assert reader.judged == [first, first]
    assert reader._shut.get(id(first)) is first
    reader.describe_loss(w.detach().sum())  # no graph: not counted, the line stays shut
    rec.loc = second
    reader.describe_loss((w * 3).sum())
    assert reader.judged == [first, first, second]
    # an equal Location that is another object: the gate's id lookup misses, PerLine decides
    rec.loc = Location("train.py", 10)
    reader.describe_loss((w * 2).sum())
    assert reader.judged == [first, first, second]
