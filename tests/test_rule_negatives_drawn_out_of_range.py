"""negatives-drawn-out-of-range (GD430): the bound a draw was asked for, the drawn embedding
lookups' ranges (instrument/negsample.py), and the rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import negsample
from rule_traces import builder, findings, only

SLUG = "negatives-drawn-out-of-range"


class _Rec:
    def __init__(self):
        self.emitted = []

    def here(self):
        return None

    def emit_aside(self, made, loc=None):
        self.emitted.append(made)


class _Finder:
    def user_frames(self, frame):
        return iter(())


def test_the_bound_a_draw_was_asked_for():
    high = negsample._draw_high
    assert high("randint", (0, 7, (3,)), {}) == 7
    assert high("randint", (7, (3,)), {}) == 7
    assert high("randint", (2,), {"high": 9, "size": (3,)}) == 9
    assert high("randperm", (12,), {}) == 12
    assert high("multinomial", (torch.ones(3), 2), {}) is None
    assert high("randint", (torch.ones(3),), {}) is None


def _ranges(n_draw):
    """The ranges the watcher tells for TransE-style head corruption drawn over ``n_draw``."""
    torch.manual_seed(0)
    ent, rel = nn.Embedding(50, 8), nn.Embedding(5, 8)
    h, r, t = torch.randint(0, 50, (32,)), torch.randint(0, 5, (32,)), torch.randint(0, 50, (32,))
    drawn = torch.randint(0, n_draw, (32,))
    h_neg = torch.where(torch.arange(32) % 2 == 0, drawn, h)
    rec = _Rec()
    rec.finder = _Finder()
    w = negsample.NegativeSampleWatcher(rec)
    fresh = [[0, 1, drawn.reshape(-1), ["train.py", 10], "randint", n_draw]]
    d_pos = (ent(h) + rel(r) - ent(t)).norm(p=1, dim=-1)
    d_neg = (ent(h_neg) + rel(r) - ent(t)).norm(p=1, dim=-1)
    loss = F.relu(1.0 + d_pos - d_neg).mean()
    w._look(loss.grad_fn, fresh)
    loss.backward()
    w._flush()
    (kind, data), = rec.emitted
    return data.get("ranges") or []


def test_the_watcher_tells_a_draw_short_of_its_table():
    rng, = _ranges(5)
    assert (rng["high"], rng["rows"], rng["others"]) == (5, 50, [5])
    assert rng["beyond"] > 0.5 and rng["data"] > 16 and rng["loc"] == ["train.py", 10]


def test_the_watcher_is_silent_on_a_draw_over_the_whole_table():
    assert _ranges(50) == []


def _trace(beyonds, high=5, others=(5,)):
    t = builder(params=[0, 1])
    for beyond in beyonds:
        t.clear([0, 1], line=10)
        t.put(ev.sampled_scores(scores=[], draws={}, line=11, ranges=[
            {"draw": 0, "loc": ["train.py", 5], "fn": "randint", "high": high, "rows": 50,
             "others": list(others), "data": 48, "beyond": beyond}]), line=11)
        t.backward(fresh=[0, 1], line=11)
        t.step(0, line=12)
    return t


def test_the_rule_warns_at_the_draw_when_every_judged_backward_is_short():
    f = only(_trace([0.9, 0.85, 0.95]), SLUG)
    assert f.location.line == 5 and f.evidence["backwards"] == 3
    assert "50 rows" in f.fix and f.evidence["high"] == 5


def test_the_rule_is_silent_on_one_backward_a_data_inside_the_bound_or_an_unmatched_bound():
    assert findings(_trace([0.9]), SLUG) == []
    assert findings(_trace([0.9, 0.0, 0.9]), SLUG) == []
    assert findings(_trace([0.9, 0.9], others=(7,)), SLUG) == []
