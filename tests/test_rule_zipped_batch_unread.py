"""zipped-batch-unread (GD411) on hand-written traces over small scripts: two DataLoaders
zipped in a training loop, one loader's batch never read."""

from __future__ import annotations

import textwrap

from graddoctor import events as ev
from graddoctor.analysis.source import zipped_unread
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "zipped-batch-unread"

SCRIPT = """\
import torch
opt = make()
for epoch in range(2):
    for (xt, yt), (xv, yv) in zip(train_loader, val_loader):
        arch_loss = crit(model(xt), yt)
        arch_loss.backward()
        train_loss = crit(model(xt), yt)
        train_loss.backward()
        opt.step()
"""


def _trace(tmp_path, script=SCRIPT, loaders=(0, 1), steps=True):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=2)
    for epoch in range(2):
        for loader in loaders:
            t.put(ev.epoch_start(loader=loader, epoch=epoch, real_len=4, replay_len=None), 4)
        for _ in range(2):
            t.backward(fresh=P, line=6)
            t.backward(accumulated=P, line=8)
            if steps:
                t.step(0, line=9)
    return t


def test_a_zipped_loader_whose_batch_nothing_reads_is_a_warning_at_the_loop(tmp_path):
    f = only(_trace(tmp_path), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 4
    assert "`val_loader`" in f.message and "xv, yv" in f.message and "lines 5, 7" in f.message
    assert f.evidence["names"] == ["xv", "yv"]


def test_one_loader_or_no_step_is_silent(tmp_path):
    assert findings(_trace(tmp_path, loaders=(0,)), SLUG) == []
    assert findings(_trace(tmp_path, steps=False), SLUG) == []


def test_a_batch_read_in_the_loop_or_after_it_is_silent(tmp_path):
    read = SCRIPT.replace("arch_loss = crit(model(xt), yt)", "arch_loss = crit(model(xv), yv)")
    assert findings(_trace(tmp_path, read), SLUG) == []
    after = SCRIPT + "print(xv.shape)\n"
    assert findings(_trace(tmp_path, after), SLUG) == []


def test_the_source_reads_enumerate_and_underscore_names(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text(textwrap.dedent("""\
        for i, ((x, y), (xu, _)) in enumerate(zip(lab, unl)):
            model(x)
        for (x, y), _ in zip(lab, unl):
            model(x)
        for (x, y), (_a, _b) in zip(lab, unl):
            model(x)
        for (x, y), batch in zip(lab, unl):
            model(x, batch)
        for x in lab:
            model(x)
        """))
    assert zipped_unread(str(path), 1) == [("unl", ["xu"], [2])]
    assert zipped_unread(str(path), 3) == []
    assert zipped_unread(str(path), 5) == []
    assert zipped_unread(str(path), 7) == []
    assert zipped_unread(str(path), 9) == []
