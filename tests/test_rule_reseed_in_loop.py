"""reseed-in-loop (GD231): hand-written traces (no torch), and the seeding watcher in-process:
the script's own RNG stream is what it would be without graddoctor."""

from __future__ import annotations

import random

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "reseed-in-loop"


def seeded_updates(t, seeds, line=5, caller=None):
    t.optimizer(0, [0], line=1)
    for seed in seeds:
        t.put(ev.reseed(fn="torch.manual_seed", seed=seed, caller=caller), line)
        t.backward(fresh=[0], line=7)
        t.step(0, line=8)


def test_the_same_seed_before_every_update_is_a_warning_at_the_seed():
    t = TraceBuilder()
    seeded_updates(t, [7, 7, 7, 7])
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 5
    assert "torch.manual_seed(7)" in f.message and "before every update" in f.message


def test_a_seed_that_changes_every_time_is_silent():
    t = TraceBuilder()
    seeded_updates(t, [0, 1, 2, 3])
    assert findings(t, SLUG) == []


def test_one_seed_before_the_loop_is_silent():
    t = TraceBuilder()
    seeded_updates(t, [7])
    t.backward(fresh=[0], line=7)
    t.step(0, line=8)
    assert findings(t, SLUG) == []


def test_a_seed_at_the_start_of_each_training_run_is_silent():
    # a sweep: seed, a new model and optimizer, a few updates; again for the next setting
    t = TraceBuilder()
    for run in range(3):
        t.put(ev.reseed(fn="torch.manual_seed", seed=0), 5)
        t.optimizer(run, [run], line=6)
        for _ in range(3):
            t.backward(fresh=[run], line=7)
            t.step(run, line=8)
    assert findings(t, SLUG) == []
    t = TraceBuilder()  # the same seed again while one optimizer keeps training: the bug
    t.optimizer(0, [0], line=6)
    for run in range(3):
        t.put(ev.reseed(fn="torch.manual_seed", seed=0), 5)
        for _ in range(3):
            t.backward(fresh=[0], line=7)
            t.step(0, line=8)
    assert "every 3 updates" in only(t, SLUG).message


def test_an_unknown_seed_value_is_silent():
    t = TraceBuilder()
    seeded_updates(t, [None, None, None])
    assert findings(t, SLUG) == []


def test_two_seedings_with_no_update_between_are_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.put(ev.reseed(fn="torch.manual_seed", seed=1), 5)
    t.put(ev.reseed(fn="torch.manual_seed", seed=1), 5)
    t.backward(fresh=[0], line=7)
    t.step(0, line=8)
    assert findings(t, SLUG) == []


def test_the_watcher_records_the_call_and_leaves_the_stream_as_it_was():
    rec = Recorder(step_budget=None)
    torch.manual_seed(3)
    expected = torch.rand(3)
    random.seed(5)
    expected_py = random.random()
    with Instrumentation(rec):
        torch.manual_seed(3)
        got = torch.rand(3)
        random.seed(5)
        got_py = random.random()
    assert torch.equal(got, expected) and got_py == expected_py
    kinds = [(e.get("fn"), e.get("seed")) for e in rec.trace if e.kind == "reseed"]
    assert ("torch.manual_seed", 3) in kinds and ("random.seed", 5) in kinds
    assert torch.manual_seed.__module__ == "torch.random"  # the patch is gone
