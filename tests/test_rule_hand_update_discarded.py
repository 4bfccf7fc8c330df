"""hand-update-discarded (GD121): the statements the script's source holds (analysis/source.py),
and the run's confirmation that no tensor changed (``updated_by_hand``)."""

from __future__ import annotations

import textwrap

import torch

from graddoctor.analysis.source import discarded_updates
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "hand-update-discarded"

SCRIPT = """\
for step in range(10):
    loss.backward()
    for p in model.parameters():
        p = p - lr * p.grad
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, updated=False, optimizer=False, backwards=3) -> TraceBuilder:
    t = TraceBuilder(path)
    if optimizer:
        t.optimizer(0, [0], line=1)
    t.param(0, "model.weight")
    for i in range(backwards):
        t.backward(fresh=[0], line=2, updated_by_hand=[0] if updated and i else None)
    return t


def test_source_statements_that_throw_the_update_away(tmp_path):
    path = _script(tmp_path, """\
        for p in params:
            p = p - lr * p.grad
            p = p.grad.clone()
            q = p - lr * p.grad
            p.sub(lr * p.grad)
            p.sub_(lr * p.grad)
            p.grad.add(p)
            torch.add(p, p.grad, alpha=-lr)
            p -= lr * p.grad
        w = w * 0.5 + w.grad
        """)
    assert discarded_updates(path) == [
        (2, "rebind", "p", "p -= lr * p.grad"),
        (5, "result", "p.sub", "p.sub_(lr * p.grad)"),
        (8, "result", "torch.add", "p.add_(p.grad, alpha=-lr)"),
    ]


def test_a_discarded_update_with_no_tensor_changed_is_an_error_at_the_statement(tmp_path):
    path = _script(tmp_path)
    f = only(_trace(path), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 4
    assert "loop variable p" in f.message
    assert f.fix.endswith("p -= lr * p.grad")


def test_silent_when_a_tensor_changed_with_an_optimizer_or_a_single_backward(tmp_path):
    path = _script(tmp_path)
    assert findings(_trace(path, updated=True), SLUG) == []
    assert findings(_trace(path, optimizer=True), SLUG) == []
    assert findings(_trace(path, backwards=1), SLUG) == []


def test_the_backward_watcher_reports_tensors_changed_between_backwards():
    def run(update):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            w = torch.ones(3, requires_grad=True)
            for _ in range(4):
                (w * 2).sum().backward()
                update(w)
                w.grad = None
        return [e.get("updated_by_hand") for e in rec.trace.of_kind("backward")]

    def discarded(w):
        with torch.no_grad():
            w.sub(w.grad)

    def in_place(w):
        with torch.no_grad():
            w.sub_(w.grad)

    def through_data(w):
        w.data = w.data - w.grad

    # tracked from its second backward on, compared from its third
    assert run(discarded) == [None] * 4
    assert run(in_place) == [None, None, [0], [0]]
    assert run(through_data) == [None, None, [0], [0]]


EMA = """\
for step in range(10):
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p = decay * ema_p + (1 - decay) * p
"""


def test_source_blends_into_a_copy_that_nothing_keeps(tmp_path):
    path = _script(tmp_path, """\
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p = d * ema_p + (1 - d) * p
        for t, s in zip(target.state_dict().values(), net.state_dict().values()):
            t = t.lerp(s, 0.01)
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p.mul_(d).add_(p, alpha=1 - d)
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p = d * ema_p + (1 - d) * p
            ema_p.data.copy_(ema_p)  # stored further down: no finding
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            new = d * ema_p + (1 - d) * p  # another name, used below
            ema_p.copy_(new)
        for h, c in zip(hs, cs):
            h = h * c  # no parameters iterated: not an update
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p = p.clone()  # no blend with itself: left alone
        """)
    assert discarded_updates(path) == [
        (2, "blend", "ema_p", "ema_p.copy_(d * ema_p + (1 - d) * p)"),
        (4, "blend", "t", "t.copy_(t.lerp(s, 0.01))"),
    ]


def test_an_ema_blend_thrown_away_is_reported_with_an_optimizer_too(tmp_path):
    path = _script(tmp_path, EMA)
    t = _trace(path, optimizer=True)
    t.step(0, line=3)
    f = only(t, SLUG)
    assert f.location.line == 6 and "never changes" in f.message and "EMA" in f.message
    assert f.fix.endswith("ema_p.copy_(decay * ema_p + (1 - decay) * p)")
    assert [r.location.line for r in f.related] == [3]
    assert findings(_trace(path, optimizer=True, backwards=1), SLUG) == []


def test_a_blend_over_named_parameters_unpacks_the_nested_names(tmp_path):
    path = _script(tmp_path, """\
        for (name, ema_p), (_, p) in zip(ema.named_parameters(), model.named_parameters()):
            ema_p = 0.9 * ema_p + 0.1 * p
        """)
    assert discarded_updates(path) == [(2, "blend", "ema_p", "ema_p.copy_(0.9 * ema_p + 0.1 * p)")]


INTO_GRAD = """\
for step in range(10):
    loss.backward()
    for p in model.parameters():
        p.grad.add_(p.data, alpha=-lr)
"""


def test_source_updates_written_into_the_gradient(tmp_path):
    path = _script(tmp_path, """\
        for p in params:
            p.grad.add_(p.data, alpha=-lr)
            p.grad.data.sub_(p, alpha=lr)
            p.grad.add_(noise)
            p.grad.mul_(0.5)
            p.data.add_(p.grad, alpha=-lr)
        """)
    assert discarded_updates(path) == [
        (2, "into_grad", "p.grad.add_(p.data, alpha=-lr)", "p.data.add_(p.grad, alpha=-lr)"),
        (3, "into_grad", "p.grad.data.sub_(p, alpha=lr)", "p.data.sub_(p.grad, alpha=lr)"),
    ]


def test_an_update_into_the_gradient_is_an_error_only_when_no_tensor_changed(tmp_path):
    path = _script(tmp_path, INTO_GRAD)
    f = only(_trace(path), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 4
    assert "into the gradient" in f.message and f.fix.endswith("p.data.add_(p.grad, alpha=-lr)")
    # weight decay added into the gradient before an update that moves the weights: silent
    assert findings(_trace(path, updated=True), SLUG) == []
