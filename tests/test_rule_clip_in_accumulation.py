"""clip-in-accumulation (GD202) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.rules.clip_in_accumulation import ClipInAccumulation
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, clip, findings, only


def test_clip_in_accumulation_found():
    t = builder()
    for window in range(2):
        t.backward(fresh=P, line=20)
        clip(t, line=21)
        for _ in range(3):
            t.backward(accumulated=P, line=20)
            clip(t, line=21)
        t.step(line=23)
        t.clear(P, line=24)
    f = only(t, "clip-in-accumulation")
    assert f.location.line == 21 and f.severity is Severity.WARNING
    assert any(r.location.line == 20 for r in f.related)


def test_clip_once_at_boundary_is_silent():
    t = builder()
    for _ in range(3):
        t.backward(fresh=P, line=20)
        for _ in range(3):
            t.backward(accumulated=P, line=20)
        clip(t, line=22)
        t.step(line=23)
        t.clear(P, line=24)
    assert findings(t, "clip-in-accumulation") == []


def test_gan_generator_backward_after_discriminator_clip_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], cls="Adam")  # D
    t.optimizer(1, [1], cls="Adam")  # G
    for _ in range(3):
        t.clear([0], opt=0)
        t.backward(fresh=[0])
        clip(t, params=[0])
        t.step(0)
        t.clear([1], opt=1)
        t.backward(fresh=[1], accumulated=[0])  # G's loss flows through D too
        t.step(1)
    assert findings(t, "clip-in-accumulation") == []


ORDER_SOURCE = """import torch
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        loss = model(x).sum() / 4
        if (i + 1) % 4 == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def _order_trace(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(ORDER_SOURCE)
    t = TraceBuilder(path=str(path))
    t.optimizer(0, P, line=1)
    for window in range(2):
        t.backward(fresh=P, line=7)
        for _ in range(2):
            t.backward(accumulated=P, line=7)
        clip(t, line=6)  # the window's last micro-batch: clipped before its own backward
        t.backward(accumulated=P, line=7)
        t.step(line=9)
        t.clear(P, line=10)
    return t


def test_clip_before_its_own_iterations_backward_says_the_order(tmp_path):
    """The clip is already at the window's boundary; what is wrong is that this micro-batch's
    backward comes after it. The fix names the order, not a boundary the script already has."""
    f = only(_order_trace(tmp_path), "clip-in-accumulation")
    assert f.location.line == 6 and f.evidence["order"] == "clip_before_own_backward"
    assert "before the backward at line 7 of the same iteration" in f.message
    assert "call loss.backward() before the clip" in f.fix and "sync_gradients" not in f.fix
    assert ClipInAccumulation().autofix(f, None) is None


def test_clip_every_micro_batch_keeps_the_boundary_fix():
    t = builder()
    t.backward(fresh=P, line=20)
    clip(t, line=21)
    t.backward(accumulated=P, line=20)
    clip(t, line=21)
    t.step(line=23)
    f = only(t, "clip-in-accumulation")
    assert "order" not in f.evidence and "right before optimizer.step()" in f.fix
