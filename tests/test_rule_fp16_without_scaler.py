"""fp16-without-scaler (GD219): hand-written traces, and the ``autocast_fp16`` mark the
GradScaler watcher (instrument/amp.py) puts on a backward."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, findings, only

SLUG = "fp16-without-scaler"


def _loop(updates=4, marked=lambda i: True, **backward):
    t = builder()
    for i in range(updates):
        t.clear(P, line=10)
        extra = {"autocast_fp16": ["train.py", 8]} if marked(i) else {}
        t.backward(fresh=P, line=11, **extra, **backward)
        t.step(line=12)
    return t


def test_float16_forwards_backpropagated_without_a_scaler_are_a_warning_at_the_backward():
    f = only(_loop(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert f.evidence == {"backwards": 4, "autocast_line": 8}
    assert f.related[0].location.line == 8


def test_silent_with_a_scaler_or_a_static_loss_scale():
    assert findings(_loop(scaled=True, scale=65536.0, scaler=0, scaler_enabled=True), SLUG) == []
    assert findings(_loop(loss_scale_factor=1024.0), SLUG) == []
    t = _loop()
    t.put(ev.scaler_update(scaler=0, enabled=True, scale=65536.0), 13)
    assert findings(t, SLUG) == []


def test_silent_when_few_backwards_follow_a_float16_forward():
    # a float16 evaluation pass left with grad on marks the next float32 training backward
    assert findings(_loop(updates=8, marked=lambda i: i in (3, 7)), SLUG) == []
    assert findings(_loop(updates=1), SLUG) == []


def test_the_watcher_marks_only_float16_autocast_with_grad_on():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for dtype, grad in ((torch.float16, True), (torch.bfloat16, True), (torch.float16, False)):
            with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype):
                out = model(torch.randn(3, 4))
            loss = out.float().sum() if grad else model(torch.randn(3, 4)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    marks = [b.get("autocast_fp16") for b in rec.trace.of_kind("backward")]
    assert marks[0] is not None and marks[0][1] > 0
    assert marks[1:] == [None, None]
