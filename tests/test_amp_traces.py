"""Traces of a GradScaler loop (no torch): steps the scaler skipped consume the gradients like a
step, and a NaN gradient norm survives the trace's JSON as standard JSON."""

from __future__ import annotations

import json
import math

from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.findings import Severity
from graddoctor.trace import Trace
from rule_traces import P, builder, nan_step


def test_scaler_skipped_step_consumes_like_a_step():
    t = builder()
    for skipped in (True, True, False, False):
        t.clear(P, line=110)
        t.backward(fresh=P, scaled=True)
        t.step(skipped=skipped)
    led = Analysis(t.trace).ledger
    assert led.discards == [] and led.old_uses == []
    found, errors = analyze(t.trace)
    assert not errors and [f for f in found if f.severity is not Severity.INFO] == []


def test_trace_with_nan_round_trips_as_standard_json():
    t = builder()
    t.backward(fresh=P)
    nan_step(t)
    text = t.trace.dumps()
    assert "NaN" not in text
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    norm = Trace.loads(text).events[-2]["norms"][0]
    assert isinstance(norm, float) and math.isnan(norm)  # read back as the number it was


def test_read_back_trace_gives_the_same_messages_with_an_infinite_scale():
    t = builder()
    t.event("scaler_init", scale=65536.0, enabled=True)
    t.backward(fresh=P, scaled=True, scale=float("inf"))
    t.event("clip", params=P, via="clip_grad_norm_", limit=0.0, total_norm=0.0)
    t.step()
    before, _ = analyze(t.trace)
    after, _ = analyze(Trace.loads(t.trace.dumps()))
    assert [f.message for f in before] == [f.message for f in after]
