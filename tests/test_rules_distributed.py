"""step-without-allreduce (GD401) and sampler-without-set-epoch (GD402) on hand-written traces,
and the timeline labels of DDP backwards."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.report.timeline import shapes
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder


def _run(t: TraceBuilder, slug: str):
    return list(find_rule(slug)().check(Analysis(t.trace)))


def _window(t, syncs, step_line=20, zero=True):
    for s in syncs:
        t.put(ev.ddp_no_sync(ddp=0), 10) if not s else None
        t.backward(fresh=[0, 1], line=12, allreduce=s)
    t.step(0, line=step_line)
    if zero:
        t.clear([0, 1], line=21)


def test_every_micro_batch_under_no_sync_is_flagged_at_the_step():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        _window(t, [False, False])
    found = _run(t, "step-without-allreduce")
    assert [(f.location.line, f.step, f.evidence["updates"]) for f in found] == [(20, 1, 3)]
    assert [r.location.line for r in found[0].related] == [10, 12]


def test_the_last_micro_batch_synchronised_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(3):
        _window(t, [False, False, True])
    assert _run(t, "step-without-allreduce") == []


def test_no_ddp_no_finding_and_a_single_sync_among_several_is_enough():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    t.backward(fresh=[0, 1], line=12)  # a plain backward: no allreduce key
    t.step(0, line=20)
    _window(t, [True, False])  # the sync may come first (its all-reduce covers the bucket)
    assert _run(t, "step-without-allreduce") == []


def test_another_optimizers_parameters_do_not_count():
    t = TraceBuilder()
    t.optimizer(0, [0])
    t.optimizer(1, [1])
    t.backward(fresh=[1], line=12, allreduce=False)  # opt 1's module is the no_sync one
    t.backward(fresh=[0], line=13, allreduce=True)
    t.step(0, line=20)
    t.step(1, line=21)
    found = _run(t, "step-without-allreduce")
    assert [f.location.line for f in found] == [21]


def test_a_sampler_restarted_with_the_same_epoch_is_flagged_at_its_second_epoch():
    t = TraceBuilder()
    t.optimizer(0, [0])
    for _ in range(3):
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    found = _run(t, "sampler-without-set-epoch")
    assert [(f.location.line, f.evidence["epochs_started"]) for f in found] == [(5, 3)]


def test_set_epoch_shuffle_false_or_one_epoch_are_silent():
    for events in ([(0, 0, True), (0, 1, True)], [(0, 0, False), (0, 0, False)],
                   [(0, 0, True)], [(0, 0, True), (1, 0, True)]):
        t = TraceBuilder()
        t.optimizer(0, [0])
        for sampler, epoch, shuffle in events:
            t.put(ev.sampler_iter(sampler=sampler, epoch=epoch, shuffle=shuffle), 5)
            t.backward(fresh=[0], line=6)
            t.step(0, line=7)
        assert _run(t, "sampler-without-set-epoch") == [], events


def test_the_timeline_shows_no_sync_and_all_reduces():
    t = TraceBuilder()
    t.optimizer(0, [0, 1])
    for _ in range(2):
        _window(t, [False, True])
    a = Analysis(t.trace)
    analyze(a)
    labels = [item.label for item in shapes(a)[0].items]
    assert labels == ["no_sync", "backward (no_sync)", "backward + all-reduce", "step", "zero_grad"]
