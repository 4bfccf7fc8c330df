"""weights-on-reduced-loss (GD329): hand-written ``weighted_reduced`` events over scripts written
to a temporary folder (the rule finds the reduced loss call in the source), the watcher on real
graphs, and its test of a per-sample factor."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.reducedweight import ReducedWeightWatcher, per_sample_factor
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "weights-on-reduced-loss"

SCRIPT = """\
import torch
import torch.nn.functional as F
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    logits = model(x)
    bce = F.binary_cross_entropy_with_logits(logits, y)
    loss = (bce * w).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, line=9):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=4)
    t.put(ev.weighted_reduced(fn="binary_cross_entropy_with_logits", reduction="mean",
                              input_shape=[64], factor_shape=[64], factor_grad=False), line)
    for _ in range(4):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    return t


def test_a_weighted_reduced_loss_is_a_warning_at_the_loss_call(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "mean over the batch" in f.message and "shape (64,)" in f.message
    assert f.fix.startswith("`F.binary_cross_entropy_with_logits(logits, y, reduction='none')`")


def test_a_module_criterion_is_reported_where_it_is_built(tmp_path):
    text = """\
        import torch
        import torch.nn as nn
        criterion = nn.MSELoss(reduction="mean")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            loss = (criterion(model(x), y) * w).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        """
    f = only(_trace(_script(tmp_path, text), line=7), SLUG)
    assert f.location.line == 3
    assert f.fix.startswith("`criterion = nn.MSELoss(reduction='none')`")


def test_without_a_product_in_the_source_the_backward_line_is_kept(tmp_path):
    text = """\
        import torch
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            loss = compute()
            opt.zero_grad(); loss.backward(); opt.step()
        """
    f = only(_trace(_script(tmp_path, text), line=5), SLUG)
    assert f.location.line == 5 and "reduction=\"none\"" in f.fix


def test_the_shape_of_a_per_sample_factor():
    assert per_sample_factor((64,), (64,))
    assert per_sample_factor((64, 1), (64, 10))
    assert not per_sample_factor((2,), (64,))  # one weight per task
    assert not per_sample_factor((), (64,))  # a number
    assert not per_sample_factor((3,), (3, 5))  # too few rows to tell samples from tasks
    assert not per_sample_factor((64,), ())  # a loss over a 0-d input


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
    w = torch.randn(5, requires_grad=True)
    x, y, weights = torch.randn(16, 5), torch.rand(16).round(), torch.rand(16)
    rec = _Rec()
    watcher = ReducedWeightWatcher(rec)
    good = (F.binary_cross_entropy_with_logits(x @ w, y, reduction="none") * weights).mean()
    watcher.describe_loss(good)
    assert rec.emitted == []
    bad = (weights * F.binary_cross_entropy_with_logits(x @ w, y)).mean()
    watcher.describe_loss(bad)
    assert rec.emitted == [ev.weighted_reduced(fn="binary_cross_entropy_with_logits", reduction="mean",
                                               input_shape=[16], factor_shape=[16], factor_grad=False)]


def test_the_watcher_stays_silent_on_task_weights_and_leaves_after_its_windows():
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    x, y = torch.randn(16, 5), torch.randn(16)
    rec = _Rec()
    watcher = ReducedWeightWatcher(rec)
    tasks = (torch.tensor([0.5, 2.0]) * torch.stack([F.mse_loss(x @ w, y), F.l1_loss(x @ w, y)])).sum()
    watcher.describe_loss(tasks)
    watcher.describe_loss(F.mse_loss(x @ w, y) * torch.tensor(0.3))  # a 0-d factor
    watcher.describe_loss((F.mse_loss(x @ w, y, reduction="sum") / 16))
    late = (torch.rand(16) * F.mse_loss(x @ w, y)).mean()
    watcher.describe_loss(late)  # after the first 3 backwards: not looked at
    assert rec.emitted == []
