"""nonfinite-grad (GD207) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

import json

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.report.json_format import finding_to_dict
from rule_traces import P, builder, findings, nan_step, only


def test_nonfinite_grad_found_at_backward():
    t = builder()
    for _ in range(2):
        t.clear(P)
        t.backward(fresh=P, line=101)
        nan_step(t)
    f = only(t, "nonfinite-grad")
    assert f.location.line == 101 and f.severity is Severity.ERROR
    assert f.evidence["norms"] == {"p0": "nan"} and f.evidence["steps_affected"] == 2
    json.dumps(finding_to_dict(f), allow_nan=False)


def test_steps_gradscaler_skipped_are_silent():
    t = builder()
    t.backward(fresh=P, scaled=True)
    t.step(skipped=True)  # the non-fused path: the optimizer never ran, no step_begin
    t.clear(P)
    t.backward(fresh=P, scaled=True)
    nan_step(t)  # a fused optimizer: it got the inf check and skipped inside
    t.event("scaler_step", 103, scaler=0, opt=0, enabled=True, fused=True, skipped=True,
            found_inf=True)
    assert findings(t, "nonfinite-grad") == []


def test_finite_steps_are_silent():
    t = builder()
    t.backward(fresh=P)
    t.event("step_begin", 5, opt=0, closure=False, norm_pids=P, norms=[1.0, 2.0], nonfinite=[])
    t.step()
    assert findings(t, "nonfinite-grad") == []


def test_a_nan_after_diverging_updates_names_the_divergence_and_the_lr():
    t = builder()
    for i in range(4):
        t.clear(P)
        t.backward(fresh=P, line=101, loss_terms=["mean"])
        if i == 3:
            t.put(ev.diverging(opt=0, first=1, last=3, norms=[1.0, 100.0], factor=10.0,
                               nonfinite=True))
            t.event("step_begin", 102, opt=0, closure=False, norm_pids=P,
                    norms=[float("nan"), 1.0], nonfinite=[0], lrs=[0.5])
        else:
            t.event("step_begin", 102, opt=0, closure=False, norm_pids=P, norms=[1.0, 0.0],
                    nonfinite=[], lrs=[0.5])
        t.step(line=102)
    f = only(t, "nonfinite-grad")
    assert "grew about 10x per update (1 -> 100): the updates diverged" in f.message
    assert f.fix.startswith("lower the learning rate (lr=0.5: try 0.05)") and "GradScaler" not in f.fix


def test_a_nan_in_full_precision_is_not_told_to_use_a_gradscaler():
    t = builder()
    t.clear(P)
    t.backward(fresh=P, line=101)
    nan_step(t)
    assert "GradScaler" not in only(t, "nonfinite-grad").fix
