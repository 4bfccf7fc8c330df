"""sampler-without-set-epoch (GD402) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from rule_traces import findings, fold_hard


def test_a_sampler_restarted_with_the_same_epoch_is_flagged_at_its_second_epoch():
    t = TraceBuilder()
    t.optimizer(0, [0])
    for _ in range(3):
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    found = findings(t, "sampler-without-set-epoch")
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
        assert findings(t, "sampler-without-set-epoch") == [], events


def test_epochs_folded_out_of_a_long_run_are_counted():
    t = TraceBuilder()
    t.optimizer(0, [0])
    for _ in range(8):
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    folded = Analysis(fold_hard(t.trace))
    assert folded.of_kind("folded")
    [finding] = find_rule("sampler-without-set-epoch")().check(folded)
    assert finding.evidence["epochs_started"] == 8 and "started 8 epochs" in finding.message


def test_a_one_batch_peek_before_set_epoch_is_not_an_epoch():
    # the DDP tutorial: next(iter(loader)) prints the batch size, then set_epoch, then training;
    # a replay that ends inside the first epoch saw the sampler start twice with epoch 0
    t = TraceBuilder()
    t.optimizer(0, [0])
    t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 4)  # the peek: no step follows
    t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 6)
    for _ in range(3):
        t.backward(fresh=[0], line=7)
        t.step(0, line=8)
    assert findings(t, "sampler-without-set-epoch") == []
    # peeks do not hide the bug either: two trained epochs with epoch 0 are still one
    for _ in range(2):
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 4)
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True), 6)
        t.backward(fresh=[0], line=7)
        t.step(0, line=8)
    [found] = findings(t, "sampler-without-set-epoch")
    assert found.location.line == 6 and found.evidence["epochs_started"] == 3


def test_set_epoch_called_with_the_same_value_points_at_that_call():
    # sampler.set_epoch(0) at line 4, every epoch: the call is the line to change
    t = TraceBuilder()
    t.optimizer(0, [0])
    for _ in range(3):
        t.put(ev.sampler_iter(sampler=0, epoch=0, shuffle=True, set_at=["train.py", 4]), 5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    found = findings(t, "sampler-without-set-epoch")
    assert [(f.location.line, f.evidence.get("set_epoch_called")) for f in found] == [(4, True)]
    assert "set_epoch(epoch)" in found[0].fix


def test_set_epoch_with_a_new_value_each_epoch_stays_silent():
    t = TraceBuilder()
    t.optimizer(0, [0])
    for epoch in range(3):
        t.put(ev.sampler_iter(sampler=0, epoch=epoch, shuffle=True, set_at=["train.py", 4]), 5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
    assert findings(t, "sampler-without-set-epoch") == []
