"""clip-before-unscale (GD201) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from rule_traces import P, builder, clip, findings, only


def unscale(t, opt=0, line=None, implicit=False, enabled=True):
    return t.event("unscale", line, scaler=0, opt=opt, enabled=enabled, implicit=implicit,
                   scale=65536.0 if enabled else None)


def scaled_backward(t, line=None, enabled=True, **kw):
    return t.backward(fresh=P, line=line, scaled=True, scaler=0, scaler_enabled=enabled,
                      scale=65536.0 if enabled else None, **kw)


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


# -- loss scaling written by hand ------------------------------------------------------------

def _hand_scaled(factor=1024.0, edited=(), norm_only=False):
    from rule_traces import builder, clip

    t = builder()
    for _ in range(2):
        t.clear([0, 1], line=9)
        t.backward(fresh=[0, 1], line=10, loss_scale_factor=factor)
        clip(t, line=11, edited=edited, norm_only=norm_only)
        t.step(0, line=12)
    return t


def test_a_clip_of_gradients_of_a_hand_scaled_loss_is_a_warning():
    from graddoctor.findings import Severity
    from rule_traces import only

    f = only(_hand_scaled(), "clip-before-unscale")
    assert f.location.line == 11 and f.severity is Severity.WARNING
    assert f.evidence["factor"] == 1024.0 and "div_(1024)" in f.fix


def test_a_hand_scaled_loss_divided_back_before_the_clip_or_a_loss_weight_is_silent():
    from rule_traces import findings

    assert findings(_hand_scaled(edited=(0, 1)), "clip-before-unscale") == []
    assert findings(_hand_scaled(factor=10.0), "clip-before-unscale") == []
    assert findings(_hand_scaled(norm_only=True), "clip-before-unscale") == []
