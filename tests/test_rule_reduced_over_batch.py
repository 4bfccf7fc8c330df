"""reduced-over-batch (GD199): hand-written ``reduce_batch`` events over scripts written to a
temporary folder (the rule finds the dim-0 call in the source), the watcher on real graphs (a
candidate is emitted only when the backward brings it a gradient), the layout test and the
source reading on their own."""

from __future__ import annotations

import math
import textwrap

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.reducebatch import ReduceBatchWatcher, reduced_over_batch
from graddoctor.rules.reduced_over_batch import first_axis_dims
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "reduced-over-batch"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    log_joint = model(x)
    nll = -torch.logsumexp(log_joint, dim=0)
    loss = nll.mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, extra=(), fn="logsumexp", shape=(32, 5)):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.reduce_batch(fn=fn, shape=list(shape), dims=[0], batch=shape[0]), 8)
    for kind, line in extra:
        t.put(kind, line)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_logsumexp_over_the_batch_is_a_warning_at_its_call(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "32×5" in f.message and "32 samples" in f.message and "its axis of length 5" in f.message
    assert f.fix.startswith("`torch.logsumexp(log_joint, dim=-1)`")


def test_a_max_written_as_a_method_is_found_by_its_name(tmp_path):
    text = SCRIPT.replace("torch.logsumexp(log_joint, dim=0)", "log_joint.max(0).values")
    f = only(_trace(_script(tmp_path, text), fn="amax"), SLUG)
    assert f.location.line == 6 and f.fix.startswith("`log_joint.max(-1)")


def test_without_a_dim_0_call_in_the_source_nothing_is_reported(tmp_path):
    for dim in ("dim=1", "dim=axis"):
        text = SCRIPT.replace("dim=0", dim)
        assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_left_to_samples_mixed_in_batch_inside_forward(tmp_path):
    path = _script(tmp_path)
    in_forward = ev.dependency(model="model", batch=32, source="loader", mixed=True,
                               op="LogsumexpBackward0", op_at=None, seq=None, modules=[],
                               forward=None)
    assert findings(_trace(path, [(in_forward, 5)]), SLUG) == []
    elsewhere = ev.dependency(model="model", batch=32, source="loader", mixed=True,
                              op="ViewBackward0", op_at=None, seq=None, modules=[], forward=None)
    assert only(_trace(path, [(elsewhere, 5)]), SLUG)


def test_the_layout_of_a_batch_reduced():
    data = {8}
    assert reduced_over_batch((8, 5), (0,), data, None)
    assert reduced_over_batch((8, 30, 3), (0,), data, None)
    assert reduced_over_batch((8, 5), (-2,), data, None)
    assert not reduced_over_batch((8, 5), (1,), data, None)  # each sample's own axis
    assert not reduced_over_batch((8, 5), (0, 1), data, None)  # one number for the batch
    assert not reduced_over_batch((8, 8), (0,), data, None)  # a (B, B) similarity matrix
    assert not reduced_over_batch((8, 1), (0,), data, None)  # a bag's (K, 1) scores
    assert not reduced_over_batch((8,), (0,), data, None)
    assert not reduced_over_batch((8, 24), (0,), {8, 24}, None)  # columns from the data
    assert not reduced_over_batch((8, 5), (0,), {7}, None)  # dim 0 is not the data's
    assert not reduced_over_batch((8, 5), (0,), data, 1)  # the loader serves one bag at a time


class _Rec:
    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc=None):
        self.emitted.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc

    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED: no later phase here
        pass


def _loss_and_backward(watcher, loss):
    watcher.describe_loss(loss)
    loss.backward()


def test_the_watcher_emits_a_reduction_the_loss_depends_on():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(6, 5)
    rec = _Rec()
    watcher = ReduceBatchWatcher(rec)
    watcher.describe_loss(torch.logsumexp(x @ w, dim=0).mean())
    assert rec.emitted == []  # nothing before the backward brings the gradient
    _loss_and_backward(watcher, torch.logsumexp(x @ w, dim=0).mean())
    _loss_and_backward(watcher, torch.logsumexp(x @ w, dim=1).mean())
    assert rec.emitted == [ev.reduce_batch(fn="logsumexp", shape=[6, 3], dims=[0], batch=6)]


def test_a_batch_max_subtracted_and_added_back_is_not_emitted():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(6, 5)
    rec = _Rec()
    watcher = ReduceBatchWatcher(rec)
    q = x @ w
    m = q.max(dim=0, keepdim=True).values
    _loss_and_backward(watcher, (m + torch.log(torch.exp(q - m).mean(0, keepdim=True))).sum())
    assert rec.emitted == []
    q = x @ w
    _loss_and_backward(watcher, (q - q.max(dim=0, keepdim=True).values).pow(2).mean())
    assert [made[1]["fn"] for made in rec.emitted] == ["max"]


def test_the_marginal_of_a_log_softmax_is_not_emitted():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(6, 5)
    rec = _Rec()
    watcher = ReduceBatchWatcher(rec)
    log_marginal = torch.logsumexp(torch.log_softmax(x @ w, dim=1), dim=0) - math.log(6)
    _loss_and_backward(watcher, (log_marginal.exp() * log_marginal).sum())
    assert rec.emitted == []


def test_the_source_reading_of_each_form_of_dim():
    assert first_axis_dims("torch.logsumexp(x, dim=0)") == (0,)
    assert first_axis_dims("torch.logsumexp(x, 0)") == (0,)
    assert first_axis_dims("x.logsumexp(0, keepdim=True)") == (0,)
    assert first_axis_dims("x.max(dim=0)") == (0,)
    assert first_axis_dims("torch.amax(x, dim=(0, 2))") == (0, 2)
    assert first_axis_dims("x.prod(-2)") == (-2,)
    assert first_axis_dims("torch.min(a, b)") is None  # elementwise
    assert first_axis_dims("x.max()") is None
    assert first_axis_dims("x.max(dim=axis)") is None


def test_a_negative_dim_naming_the_batch_is_read_as_dim_0():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(6, 5)
    rec = _Rec()
    watcher = ReduceBatchWatcher(rec)
    _loss_and_backward(watcher, (x @ w).amax(dim=-2).mean())  # torch saves -2 as 2**64 - 2
    _loss_and_backward(watcher, (x @ w).amax(dim=-1).mean())
    assert rec.emitted == [ev.reduce_batch(fn="amax", shape=[6, 3], dims=[0], batch=6)]


def test_a_time_major_max_over_time_is_left_when_the_labels_tell_the_batch():
    v = torch.randn(8, requires_grad=True)
    x = torch.randn(12, 5, 8)  # (T, B, F): dim 0 is time, as long as the data's leading axis
    y = torch.randint(0, 8, (5,))
    rec = _Rec()
    watcher = ReduceBatchWatcher(rec)
    pooled = (x * v).max(dim=0).values
    _loss_and_backward(watcher, torch.nn.functional.cross_entropy(pooled, y))
    assert rec.emitted == []
    _loss_and_backward(watcher, (x * v).max(dim=0).values.pow(2).mean())  # nothing tells B
    assert [made[1]["shape"] for made in rec.emitted] == [[12, 5, 8]]


def test_batch_axis_inside_a_samples_first_layout():
    from graddoctor.instrument.reducebatch import batch_axis_inside

    data = {(32, 8), (5, 32, 2)}  # the batch, and a draw laid out [K, B, ...]
    assert batch_axis_inside((5, 32), [1], data, 32) == 1
    assert batch_axis_inside((5, 32), [0], data, 32) is None  # over the samples: right
    assert batch_axis_inside((5, 32), [1], data, None) is None  # no DataLoader: no batch known
    assert batch_axis_inside((32, 5), [0], data, 32) is None  # the batch at dim 0: the old case
    assert batch_axis_inside((5, 32), [1], {(5, 8)}, 32) is None  # no data of the batch below
    assert batch_axis_inside((32, 32), [1], data, 32) is None  # (B, B): either axis
    assert batch_axis_inside((1, 32), [1], data, 32) is None  # nothing left of its own
    # the axis left is as long as another tensor of the data (captions against images)
    assert batch_axis_inside((7, 32), [1], data | {(7, 5)}, 32) is None


def test_a_samples_first_reduction_over_the_batch_points_at_the_call_with_that_dim(tmp_path):
    text = SCRIPT.replace("torch.logsumexp(log_joint, dim=0)", "torch.logsumexp(log_joint, dim=1)")
    path = _script(tmp_path, text)
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.reduce_batch(fn="logsumexp", shape=[5, 32], dims=[1], batch=32, batch_dim=1), 8)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    f = only(t, SLUG)
    assert f.location.line == 6 and "over dim 1, the batch's 32 samples" in f.message
    assert "`torch.logsumexp(log_joint, dim=0)`" in f.fix
    # the same event never matches a call over dim 0 (the samples: right)
    t = TraceBuilder(_script(tmp_path, SCRIPT))
    t.optimizer(0, P, line=3)
    t.put(ev.reduce_batch(fn="logsumexp", shape=[5, 32], dims=[1], batch=32, batch_dim=1), 8)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    assert findings(t, SLUG) == []
