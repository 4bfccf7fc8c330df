"""clip-clips-nothing (GD208) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only


def clip(t, params=(), spent=True, line=20, norm_only=False, untracked=0, **kw):
    return t.put(ev.clip(via="clip_grad_norm_", params=list(params), with_grad=list(params),
                         untracked=untracked, limit="inf" if norm_only else 1.0, norm_type=2.0,
                         norm_only=norm_only, total_norm=None, edited=[], spent=spent, **kw), line)


def test_clip_of_a_used_up_generator_is_an_error_at_the_clip():
    t = builder()
    for _ in range(3):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        clip(t, line=20)
        t.step(0, line=21)
    f = only(t, "clip-clips-nothing")
    assert (f.location.line, f.severity) == (20, Severity.ERROR)
    assert [r.location.line for r in f.related] == [21, 1]
    assert f.evidence["occurrences"] == 3 and f.evidence["spent"] is True


def test_clip_of_an_iterator_it_cannot_look_into_is_a_warning():
    t = builder()
    t.backward(fresh=P, line=11)
    clip(t, spent=None)
    t.step(0, line=21)
    f = only(t, "clip-clips-nothing")
    assert f.severity is Severity.WARNING and "yields nothing" in f.message
    t = builder()  # a trace recorded before `spent` existed reads the same
    t.backward(fresh=P, line=11)
    t.event("clip", 20, via="clip_grad_norm_", params=[], with_grad=[], untracked=0, limit=1.0,
            norm_type=2.0, norm_only=False, total_norm=None, edited=[])
    t.step(0, line=21)
    assert only(t, "clip-clips-nothing").severity is Severity.WARNING


def test_clip_clips_nothing_silent_cases():
    def run(**kw):
        t = builder()
        t.backward(fresh=P, line=11)
        extra = kw.pop("extra", None)
        clip(t, **kw)
        if extra:
            extra(t)
        t.step(0, line=21, without_grad=P if kw.get("line") == 99 else [])
        return findings(t, "clip-clips-nothing")

    assert run(spent=False) == []                # an empty list, a fresh empty generator
    assert run(norm_only=True) == []             # clip_grad_norm_(params, inf): measuring only
    assert run(params=P) == []                   # it received the parameters
    assert run(untracked=2) == []                # it received tensors graddoctor does not track
    assert run(line=99) == []                    # the step applies no gradient
    assert run(extra=lambda t: clip(t, params=P, spent=False, line=22)) == []  # clipped again


def test_clip_clips_nothing_needs_a_step_with_gradients_after_it():
    t = builder()
    t.backward(fresh=P, line=11)
    t.step(0, line=12)
    clip(t)  # the replay ended before another step
    assert findings(t, "clip-clips-nothing") == []
    t = builder()
    t.backward(fresh=P, line=11)
    clip(t)
    t.put(ev.step(opt=0, skipped=True), 21)  # the scaler skipped it: nothing applied
    assert findings(t, "clip-clips-nothing") == []
