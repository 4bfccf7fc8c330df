"""GD2xx rules on hand-written traces (no torch): each bug is found at the right line, and the
correct patterns of DESIGN §4 stay silent."""

from __future__ import annotations

import json

from graddoctor.analysis.run_rules import analyze
from graddoctor.findings import Severity
from graddoctor.report.json_format import finding_to_dict
from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.trace import Trace, TraceBuilder

P = [0, 1]  # the model's parameters


# -- helpers for the event kinds of this module ---------------------------------------------
def clip(t, params=P, line=None, norm_only=False, via="clip_grad_norm_", edited=()):
    return t.event("clip", line, via=via, params=list(params), with_grad=list(params), untracked=0,
                   limit="inf" if norm_only else 1.0, norm_type=2.0, norm_only=norm_only,
                   total_norm=None, edited=list(edited))


def unscale(t, opt=0, line=None, implicit=False, enabled=True):
    return t.event("unscale", line, scaler=0, opt=opt, enabled=enabled, implicit=implicit,
                   scale=65536.0 if enabled else None)


def scaled_backward(t, line=None, enabled=True, **kw):
    return t.backward(fresh=P, line=line, scaled=True, scaler=0, scaler_enabled=enabled,
                      scale=65536.0 if enabled else None, **kw)


def sched(t, line=None, opt=0, cls="StepLR"):
    return t.event("scheduler_step", line, sched=0, cls=cls, opt=opt)


def epoch(t, number, real_len=9, replay_len=9, loader=0, line=None):
    return t.event("epoch_start", line, loader=loader, epoch=number, real_len=real_len,
                   replay_len=replay_len)


def findings(trace_or_builder, slug):
    trace = trace_or_builder.trace if isinstance(trace_or_builder, TraceBuilder) else trace_or_builder
    return list(find_rule(slug)().check(Analysis(trace)))


def only(trace, slug):
    found = findings(trace, slug)
    assert len(found) == 1, found
    return found[0]


def builder(cls="SGD") -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, P, line=1, cls=cls)
    return t


# -- clip-before-unscale ----------------------------------------------------------------------
def test_clip_before_unscale_found_with_scale_in_evidence():
    t = builder()
    for _ in range(3):
        t.clear(P, line=10)
        scaled_backward(t, line=11)
        clip(t, line=12)
        unscale(t, line=13, implicit=True)
        t.step(line=13)
    f = only(t, "clip-before-unscale")
    assert f.location.line == 12 and f.severity is Severity.ERROR
    assert f.evidence["scale"] == 65536.0 and f.evidence["scaler_enabled"] is True
    assert f.evidence["occurrences"] == 3
    assert {r.location.line for r in f.related} == {11, 13}


def test_clip_before_unscale_holds_when_scaler_disabled():
    t = builder()
    t.clear(P, line=10)
    scaled_backward(t, line=11, enabled=False)
    clip(t, line=12)
    t.step(line=13)
    f = only(t, "clip-before-unscale")
    assert f.severity is Severity.ERROR and "disabled" in f.message
    assert f.evidence["scaler_enabled"] is False and f.evidence["scale"] is None


def test_unscale_then_clip_is_silent():
    t = builder()
    for _ in range(3):
        t.clear(P, line=10)
        scaled_backward(t, line=11)
        unscale(t, line=12)
        clip(t, line=13)
        t.step(line=14)
        t.event("scaler_update", 15, scaler=0, enabled=True, scale=65536.0)
    assert findings(t, "clip-before-unscale") == []


def test_clip_of_unscaled_backward_and_norm_only_clip_are_silent():
    t = builder()
    t.clear(P)
    t.backward(fresh=P)
    clip(t)                    # plain loop, no AMP
    t.step()
    t.clear(P)
    scaled_backward(t)
    clip(t, norm_only=True)    # measuring the (scaled) norm only
    t.step()
    assert findings(t, "clip-before-unscale") == []


def test_hand_edited_grads_lower_clip_before_unscale_to_info():
    t = builder()
    scaled_backward(t, line=11)
    clip(t, line=12, edited=P)
    t.step()
    assert only(t, "clip-before-unscale").severity is Severity.INFO


# -- clip-in-accumulation ---------------------------------------------------------------------
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


# -- clip-before-backward ---------------------------------------------------------------------
def test_clip_before_backward_found():
    t = builder()
    for _ in range(3):
        t.clear(P, line=30)
        clip(t, line=31)
        t.backward(fresh=P, line=32)
        t.step(line=33)
    f = only(t, "clip-before-backward")
    assert f.location.line == 31 and f.severity is Severity.ERROR
    assert f.evidence["after_step"] is False


def test_clip_after_step_found():
    t = builder()
    for _ in range(3):
        t.clear(P, line=30)
        t.backward(fresh=P, line=31)
        t.step(line=32)
        clip(t, line=33, via="clip_grad_value_")
    f = only(t, "clip-before-backward")
    assert f.location.line == 33 and f.evidence["after_step"] is True
    assert "already applied" in f.message


def test_plain_clip_and_norm_logging_are_silent():
    t = builder()
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=P)
        clip(t)
        t.step()
        clip(t, norm_only=True)  # clip_grad_norm_(params, inf) for logging
    assert findings(t, "clip-before-backward") == []


def test_clip_of_params_that_never_get_grads_is_silent():
    t = builder()
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=[0])
        t.step()
        clip(t, params=[1])  # a frozen part: nothing ever follows
    assert findings(t, "clip-before-backward") == []


# -- unscaled-accumulation --------------------------------------------------------------------
def accumulation(t, k=4, windows=3, factor=1.0, line=40, step_line=42, edit=False, tail=0):
    for w in range(windows):
        for i in range(k):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=line,
                       loss_scale_factor=factor, batch=[0, 0, w * k + i])
        if edit:
            t.event("grad_edit", 41, opt=0, params=P)
        t.step(line=step_line)
        t.clear(P, line=43)
    for i in range(tail):  # a flushed tail: a shorter window
        t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=line,
                   loss_scale_factor=factor)
    if tail:
        t.step(line=step_line)


def test_unscaled_accumulation_found_with_sgd():
    t = builder("SGD")
    accumulation(t, tail=1)
    f = only(t, "unscaled-accumulation")
    assert f.location.line == 40 and f.severity is Severity.WARNING
    assert f.evidence["k"] == 4 and f.evidence["windows"] == 3


def test_divided_loss_is_silent():
    for factor in (0.25, 1 / 8, 1 / (4 * 32)):  # / k, / 2k, / (k * batch)
        t = builder("SGD")
        accumulation(t, factor=factor, tail=1)
        assert findings(t, "unscaled-accumulation") == [], factor


def test_unknown_factor_is_silent():
    t = builder("SGD")
    accumulation(t, factor=None)
    assert findings(t, "unscaled-accumulation") == []


def test_hand_rescaled_gradients_are_silent():
    t = builder("SGD")
    accumulation(t, edit=True)
    assert findings(t, "unscaled-accumulation") == []


def test_other_factor_is_info():
    t = builder("SGD")
    accumulation(t, factor=0.5)
    f = only(t, "unscaled-accumulation")
    assert f.severity is Severity.INFO and f.evidence["loss_scale_factor"] == 0.5


def test_adam_without_clipping_is_info_with_clipping_warning():
    t = builder("AdamW")
    accumulation(t)
    assert only(t, "unscaled-accumulation").severity is Severity.INFO
    t = builder("AdamW")
    accumulation(t)
    clip(t)
    assert only(t, "unscaled-accumulation").severity is Severity.WARNING


def test_several_losses_at_different_lines_are_not_accumulation():
    t = builder("SGD")
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=P, line=50, loss_scale_factor=1.0)
        t.backward(accumulated=P, line=51, loss_scale_factor=1.0)
        t.step()
    assert findings(t, "unscaled-accumulation") == []


# -- accumulation-leftover --------------------------------------------------------------------
def per_epoch_index(t, epochs=3, length=9, k=4, flush=False, clear_at_epoch_start=False,
                    real_len=9):
    """``if (i + 1) % k == 0`` on the per-epoch index (optionally ``or (i + 1) == length``)."""
    fresh = True
    for e in range(epochs):
        if clear_at_epoch_start:
            t.clear(P, line=59)
            fresh = True
        epoch(t, e, real_len=real_len, replay_len=length, line=60)
        for i in range(length):
            t.backward(fresh=P if fresh else (), accumulated=() if fresh else P, line=61,
                       loss_scale_factor=1 / k, batch=[0, e, i])
            fresh = False
            if (i + 1) % k == 0 or (flush and i + 1 == length):
                t.step(line=62)
                t.clear(P, line=63)
                fresh = True


def global_counter(t, epochs=3, length=9, k=4):
    n = 0
    for e in range(epochs):
        epoch(t, e, line=60)
        for i in range(length):
            t.backward(fresh=P if n % k == 0 else (), accumulated=() if n % k == 0 else P, line=61,
                       loss_scale_factor=1 / k, batch=[0, e, i])
            n += 1
            if n % k == 0:
                t.step(line=62)
                t.clear(P, line=63)


def test_accumulation_leftover_found():
    t = builder()
    per_epoch_index(t)
    f = only(t, "accumulation-leftover")
    assert f.location.line == 62 and f.severity is Severity.WARNING
    assert f.evidence["k"] == 4 and f.evidence["leftover_batches"] == 1
    assert f.evidence["real_len"] == 9 and f.evidence["replay_len"] == 9
    assert any(r.location.line == 61 for r in f.related)


def test_accumulation_leftover_is_info_when_real_length_divisible():
    t = builder()
    per_epoch_index(t, real_len=32)
    f = only(t, "accumulation-leftover")
    assert f.severity is Severity.INFO
    assert (f.evidence["real_len"], f.evidence["replay_len"], f.evidence["k"]) == (32, 9, 4)


def test_tail_flush_global_counter_and_epoch_start_clear_are_silent():
    for build in (lambda t: per_epoch_index(t, flush=True), global_counter,
                  lambda t: per_epoch_index(t, clear_at_epoch_start=True)):
        t = builder()
        build(t)
        assert findings(t, "accumulation-leftover") == []
        assert findings(t, "misplaced-zero-grad") == []
        assert findings(t, "unscaled-accumulation") == []


def test_clear_inside_new_epoch_dropping_the_tail_is_not_misplaced():
    t = builder()
    for e in range(3):
        epoch(t, e)
        for i in range(9):
            if i % 4 == 0:
                t.clear(P, line=70)  # window start: drops last epoch's partial window at i == 0
            t.backward(fresh=P if i % 4 == 0 else (), accumulated=P if i % 4 else (), line=71,
                       loss_scale_factor=0.25, batch=[0, e, i])
            if (i + 1) % 4 == 0:
                t.step(line=72)
    assert findings(t, "misplaced-zero-grad") == []
    assert findings(t, "accumulation-leftover") == []


def test_misplaced_zero_grad_still_found_inside_an_epoch():
    t = builder()
    epoch(t, 0)
    for i in range(8):
        t.clear(P, line=80)  # before every micro-batch: the real bug
        t.backward(fresh=P, line=81, batch=[0, 0, i])
        if (i + 1) % 4 == 0:
            t.step(line=82)
    assert [f.location.line for f in findings(t, "misplaced-zero-grad")] == [80]


# -- scheduler-before-optimizer ---------------------------------------------------------------
def test_scheduler_before_first_step_found():
    t = builder()
    for e in range(3):
        sched(t, line=90)
        for _ in range(2):
            t.clear(P)
            t.backward(fresh=P)
            t.step(line=94)
    f = only(t, "scheduler-before-optimizer")
    assert f.location.line == 90 and f.severity is Severity.WARNING
    assert f.related[0].location.line == 94


def test_scheduler_after_step_skipped_step_and_plateau_are_silent():
    t = builder()
    for _ in range(3):  # OneCycleLR after every step
        t.clear(P)
        t.backward(fresh=P)
        t.step()
        sched(t, cls="OneCycleLR")
    assert findings(t, "scheduler-before-optimizer") == []
    t = builder()
    t.backward(fresh=P)
    t.step(skipped=True)  # GradScaler skipped the first step
    sched(t)
    t.clear(P)
    t.backward(fresh=P)
    t.step()
    assert findings(t, "scheduler-before-optimizer") == []
    t = builder()
    sched(t, cls="ReduceLROnPlateau")
    t.backward(fresh=P)
    t.step()
    assert findings(t, "scheduler-before-optimizer") == []


# -- nonfinite-grad ---------------------------------------------------------------------------
def nan_step(t, skipped=False):
    t.event("step_begin", 102, opt=0, closure=False, norm_pids=P, norms=[float("nan"), 1.0],
            nonfinite=[0])
    t.step(line=102, skipped=skipped)


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


# -- the ledger and the JSON contract ---------------------------------------------------------
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
    assert Trace.loads(text).events[-2]["norms"][0] == "nan"


def epochs_with_leftover_windows(t, factor, sizes=(3, 2), epochs=3):
    """Each epoch: a full window of sizes[0] micro-batches, then the epoch's shorter leftover."""
    for e in range(epochs):
        for size in sizes:
            for i in range(size):
                t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=40,
                           loss_scale_factor=factor, batch=[e, 0, i])
            t.step(line=42)
            t.clear(P, line=43)


def test_leftover_windows_divided_by_the_full_window_are_silent():
    """accelerate (gradient_accumulation_steps=3, 5 batches an epoch) divides the epoch's last
    window of 2 by 3 as well: as many short windows as full ones must not make 1/3 'odd'."""
    t = builder("AdamW")
    epochs_with_leftover_windows(t, 1 / 3)
    assert findings(t, "unscaled-accumulation") == []
    t = builder("AdamW")
    epochs_with_leftover_windows(t, 1 / 5)  # divides by neither window: still asked about
    assert only(t, "unscaled-accumulation").severity is Severity.INFO
    t = builder("SGD")
    epochs_with_leftover_windows(t, 1.0)  # not divided at all: still the bug
    assert only(t, "unscaled-accumulation").severity is Severity.WARNING
