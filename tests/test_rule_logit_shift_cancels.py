"""logit-shift-cancels (GD190): hand-written ``shift_cancelled`` events, and the watcher's
invariant on real tensors: which terms are constant along the class axis, which normalise the
logits, and a forward followed through the wrapped arithmetic to a softmax."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.shiftcancel import class_axes, constant_along, normalises
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "logit-shift-cancels"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    cos = model(x)
    logits = 30.0 * (cos - 0.2)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _trace(tmp_path, *made):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=3)
    for item in made:
        t.put(item, 6)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_margin_on_every_class_is_a_warning_at_its_line(tmp_path):
    made = ev.shift_cancelled(consumer="cross_entropy", grad=False, value=0.2, scalar=True, classes=8)
    f = only(_trace(tmp_path, made), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "logits = 30.0 * (cos - 0.2)" in f.message and "all 8 classes" in f.message
    assert "one_hot" in f.fix


def test_a_term_with_gradient_names_its_parameters_and_a_per_row_term_the_batch(tmp_path):
    with_grad = ev.shift_cancelled(consumer="softmax", grad=True, value=None, scalar=False, classes=5)
    f = only(_trace(tmp_path, with_grad), SLUG)
    assert "zero gradient" in f.message and "one_hot" not in f.fix
    per_row = ev.shift_cancelled(consumer="softmax", grad=False, value=0.5, scalar=False, classes=5)
    f = only(_trace(tmp_path, per_row), SLUG)
    assert "one value per row" in f.message and "dim=0" in f.fix


def test_one_finding_per_line(tmp_path):
    made = ev.shift_cancelled(consumer="cross_entropy", grad=False, value=0.2, scalar=True, classes=8)
    assert len(findings(_trace(tmp_path, made, made), SLUG)) == 1


def test_what_is_constant_along_the_class_axis():
    logits = torch.randn(4, 6)
    assert constant_along(0.3, -1, 6)
    assert constant_along(torch.tensor(0.3), -1, 6)
    assert constant_along(torch.randn(4, 1), -1, 6)  # one value per row
    assert constant_along(torch.randn(4, 1).expand(4, 6).clone(), -1, 6)  # repeated values
    assert not constant_along(torch.randn(6), -1, 6)  # class priors
    assert not constant_along(0.3 * F.one_hot(torch.arange(4) % 6, 6), -1, 6)  # target only
    assert not constant_along(torch.randn(4, 6, requires_grad=True), -1, 6)  # values not read
    assert class_axes(logits) == (-1,) and class_axes(torch.randn(2, 3, 5, 5)) == (-1, -3)


def test_a_reduction_of_the_logits_themselves_normalises_them():
    x = torch.randn(4, 6)
    assert normalises(x.amax(-1, keepdim=True), x, (-1,))
    assert normalises(x.logsumexp(-1, keepdim=True), x, (-1,))
    assert normalises(x.max(), x, (-1,))
    assert not normalises(torch.full((4, 1), 0.2), x, (-1,))
    assert not normalises(0.2, x, (-1,))


def _consumed(monkeypatch, forward):
    """Run ``forward`` under an installed watcher; the events it emitted."""
    from graddoctor.instrument.patcher import Patcher
    from graddoctor.instrument.shiftcancel import ShiftCancelWatcher

    emitted = []

    class Finder:
        @staticmethod
        def is_user_file(name):
            return name == __file__

    class Rec:
        finder = Finder()

        def here(self):
            from graddoctor.trace import Location
            return Location(__file__, 1)

        def emit_aside(self, made, loc):
            emitted.append(made)

        def internal_error(self, what, exc):
            raise exc

        def retire(self, topic, subscriber):
            pass

    watcher = ShiftCancelWatcher(Rec())
    patcher = Patcher()
    watcher.install(patcher)
    try:
        forward()
    finally:
        patcher.undo()
    return emitted


def test_a_forward_followed_to_the_softmax(monkeypatch):
    cos = torch.randn(6, 5, requires_grad=True)
    y = torch.randint(0, 5, (6,))
    (kind, data), = _consumed(monkeypatch, lambda: F.cross_entropy(30.0 * (cos - 0.2), y))
    assert kind == "shift_cancelled" and data["scalar"] and data["classes"] == 5
    assert _consumed(monkeypatch, lambda: F.cross_entropy(
        30.0 * (cos - 0.2 * F.one_hot(y, 5)), y)) == []
    assert _consumed(monkeypatch, lambda: F.cross_entropy(cos / 2.0, y)) == []
    assert _consumed(monkeypatch, lambda: F.mse_loss(cos - 0.2, torch.zeros(6, 5))) == []
    stable = lambda: torch.log_softmax(cos - cos.max(dim=1, keepdim=True).values, dim=1)  # noqa: E731
    assert _consumed(monkeypatch, stable) == []
    bias = torch.zeros(6, 1, requires_grad=True)
    (kind, data), = _consumed(monkeypatch, lambda: torch.softmax(cos + bias, dim=-1))
    assert data["grad"] and data["value"] is None


CENTER = """\
import torch
def update(center, teacher_out, m):
    batch_center = teacher_out.mean(dim=1, keepdim=True)
    return center * m + batch_center * (1 - m)
"""


def _center_trace(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1)
    t.put(ev.shift_cancelled(consumer="softmax", grad=False, value=0.1, scalar=False, classes=8), 4)
    t.backward(fresh=P, line=4)
    t.step(line=4)
    return t


def test_a_per_row_term_is_reported_where_it_was_reduced_over_the_classes(tmp_path):
    assert only(_center_trace(tmp_path, "a.py", CENTER), SLUG).location.line == 3
    over_batch = CENTER.replace("dim=1", "dim=0")  # no reduction over the classes: kept
    assert only(_center_trace(tmp_path, "b.py", over_batch), SLUG).location.line == 4
