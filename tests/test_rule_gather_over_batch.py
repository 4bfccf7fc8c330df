"""gather-over-batch (GD323): hand-written ``gather_batch`` events over scripts written to a
temporary folder (the rule finds the dim=0 call in the source), the watcher on real graphs, its
test of a gather's layout, and the source reading on its own."""

from __future__ import annotations

import textwrap

import torch

from graddoctor import events as ev
from graddoctor.analysis.source import gather_first_axis_calls
from graddoctor.findings import Severity
from graddoctor.instrument.gatherbatch import GatherBatchWatcher, picks_along_batch
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "gather-over-batch"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    q_values = model(states)
    q = q_values.gather(0, actions.unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(q, target)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.gather_batch(shape=[64, 4], index=[64, 1], largest=3, batch=64), 8)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_gather_along_the_batch_is_a_warning_at_its_call(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "64 samples of a 64×4 tensor" in f.message and "at most 3" in f.message
    assert f.fix.startswith("`q_values.gather(1, actions.unsqueeze(1))`")


def test_without_a_dim_0_call_in_the_source_nothing_is_reported(tmp_path):
    text = SCRIPT.replace("gather(0,", "gather(axis,")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_the_layout_of_a_pick_along_the_batch():
    data = {64}
    assert picks_along_batch((64, 4), (64, 1), 3, data, None)
    assert picks_along_batch((64, 4), (64, 1), 3, data, 64)
    assert not picks_along_batch((64, 4), (64, 1), 3, data, 32)  # another batch than the loader's
    assert not picks_along_batch((64, 4), (64, 4), 3, data, None)  # whole rows moved
    assert not picks_along_batch((64, 4), (64, 1), 40, data, None)  # row numbers
    assert not picks_along_batch((4, 8), (4, 1), 3, {4}, None)  # the batch no longer than dim 1
    assert not picks_along_batch((64, 64), (64, 1), 3, data, None)  # a (B, B) matrix
    assert not picks_along_batch((64, 4), (1, 4), 3, data, None)  # one row of picks
    assert not picks_along_batch((64, 4), (64, 1), 3, {7}, None)  # dim 0 is not the data's
    assert not picks_along_batch((64,), (64,), 3, data, None)  # 1-D


class _Rec:
    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
        pass

    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc):
        self.emitted.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc


def test_the_watcher_reads_the_graph_of_the_loss():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(16, 5)
    a = torch.randint(0, 3, (16, 1))
    rec = _Rec()
    watcher = GatherBatchWatcher(rec)
    good = ((x @ w).gather(1, a) - 1).pow(2).mean()
    watcher.describe_loss(good)
    assert rec.emitted == []
    bad = ((x @ w).gather(0, a) - 1).pow(2).mean()
    watcher.describe_loss(bad)
    assert rec.emitted == [ev.gather_batch(shape=[16, 3], index=[16, 1], largest=2, batch=16)]


def test_the_watcher_stays_silent_on_rows_looked_up_and_leaves_after_its_windows():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(16, 5)
    rec = _Rec()
    watcher = GatherBatchWatcher(rec)
    rows = (x @ w).gather(0, torch.randperm(16).unsqueeze(1).expand(-1, 3)).sum()
    watcher.describe_loss(rows)
    partner = (x @ w).gather(0, torch.full((16, 1), 9)).sum()  # a row number past dim 1
    watcher.describe_loss(partner)
    watcher.describe_loss((x @ w).sum())
    late = (x @ w).gather(0, torch.randint(0, 3, (16, 1))).sum()
    watcher.describe_loss(late)  # after the first 3 backwards: not looked at
    assert rec.emitted == []


def test_the_source_reading_finds_each_form_of_dim_0(tmp_path):
    path = _script(tmp_path, """\
        a = q.gather(0, idx)
        b = torch.gather(q, 0, idx)
        c = q.gather(dim=0, index=idx)
        d = torch.take_along_dim(q, idx, dim=0)
        e = net(s).gather(0, idx)
        f = q.gather(1, idx)
        g = torch.gather(q, 1, idx)
        h = torch.take_along_dim(q, idx, 0)
        i = q.take_along_dim(idx, 1)
        """)
    lines = [line for line, _ in gather_first_axis_calls(path)]
    assert lines == [1, 2, 3, 4, 5, 8]


CROSSED = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    probs = F.softmax(model(x), dim=1)
    p_y = probs[:, y]
    loss = ((1 - p_y ** 0.7) / 0.7).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_columns_picked_by_the_labels_are_a_warning_at_the_subscript(tmp_path):
    t = TraceBuilder(_script(tmp_path, CROSSED))
    t.optimizer(0, P, line=3)
    t.put(ev.gather_batch(shape=[64, 5], index=[64], largest=4, batch=64, crossed=True), 8)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "`probs[:, y]`" in f.message and "64×64 matrix" in f.message
    assert f.fix.startswith("pick one value per row: `probs[torch.arange(probs.size(0)), y]`")


def test_the_watcher_finds_columns_picked_by_one_class_per_sample():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(16, 5)
    y = torch.randint(0, 3, (16,))
    rec = _Rec()
    watcher = GatherBatchWatcher(rec)
    probs = (x @ w).softmax(1)
    watcher.describe_loss((1 - probs[torch.arange(16), y]).mean())  # paired: one pick a row
    assert rec.emitted == []
    watcher.describe_loss((1 - probs[:, y]).mean())
    assert rec.emitted == [ev.gather_batch(shape=[16, 3], index=[16], largest=int(y.max()),
                                           batch=16, crossed=True)]


def test_the_watcher_leaves_distinct_sampled_columns_alone():
    torch.manual_seed(0)
    w = torch.randn(5, 40, requires_grad=True)
    x = torch.randn(16, 5)
    rec = _Rec()
    watcher = GatherBatchWatcher(rec)
    watcher.describe_loss((x @ w)[:, torch.randperm(40)[:16]].logsumexp(1).mean())
    assert rec.emitted == []


def test_the_source_reading_finds_columns_picked_by_a_name(tmp_path):
    from graddoctor.analysis.source import column_picks_by_name
    path = _script(tmp_path, """\
        a = probs[:, y]
        b = probs[torch.arange(n), y]
        c = logits[:, batch.y]
        d = x[:, 0]
        e = x[:, :3]
        """)
    assert [(line, value, index) for line, _, value, index in column_picks_by_name(path)] == [
        (1, "probs", "y"), (3, "logits", "batch.y")]
