"""clip-misses-update (GD215) on hand-written traces: a clip between backward and step whose
gradients are none of those the step applies; silent when some clipped gradient is applied."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only


def clip(t, params=(), with_grad=None, untracked=0, line=20, norm_only=False):
    params = list(params)
    return t.put(ev.clip(via="clip_grad_norm_", params=params,
                         with_grad=params if with_grad is None else list(with_grad),
                         untracked=untracked, limit="inf" if norm_only else 1.0, norm_type=2.0,
                         norm_only=norm_only, total_norm=None, edited=[], spent=False), line)


def update(t, clips, step_line=21, extra=()):
    t.clear(P, line=10)
    t.backward(fresh=P, line=11)
    for kw in clips:
        clip(t, **kw)
    for e in extra:
        t.put(e, 21)
    t.step(0, line=step_line)


def test_clip_of_untracked_tensors_is_a_warning_at_the_clip():
    t = builder()
    for _ in range(3):
        update(t, [{"untracked": 4}])  # an EMA copy: frozen tensors, no gradients
    f = only(t, "clip-misses-update")
    assert (f.location.line, f.severity) == (20, Severity.WARNING)
    assert [r.location.line for r in f.related] == [21]
    assert "none of the 4 tensors" in f.message and f.evidence["occurrences"] == 3


def test_clip_of_stale_gradients_of_params_no_optimizer_steps():
    t = builder()
    t.param(5)
    update(t, [{"params": [5]}])
    f = only(t, "clip-misses-update")
    assert "no optimizer steps" in f.message and f.evidence["clipped"] == ["p5"]


def test_clip_of_params_without_gradient():
    t = builder(params=[0, 1, 2])
    update(t, [{"params": [2], "with_grad": []}])
    assert "has a gradient" in only(t, "clip-misses-update").message


def test_any_clipped_gradient_applied_keeps_it_silent():
    t = builder()
    update(t, [{"params": [0]}])  # a part of the model, on purpose
    update(t, [{"untracked": 2}, {"params": [1]}])  # per-group clips, one of them useless
    update(t, [{"params": [], "untracked": 0}])  # clips nothing at all: clip-clips-nothing's
    update(t, [{"untracked": 2, "norm_only": True}])  # only measures
    assert findings(t, "clip-misses-update") == []


def test_grads_copied_after_the_clip_keep_it_silent():
    t = builder()
    t.param(5)
    update(t, [{"params": [5]}], extra=[ev.grad_edit(opt=0, params=list(P))])  # master weights
    assert findings(t, "clip-misses-update") == []


def test_a_second_optimizer_is_judged_with_the_first():
    t = builder()
    t.optimizer(1, [2], line=2)
    t.clear(P, line=10)
    t.backward(fresh=[0, 1, 2], line=11)
    clip(t, params=[0])
    t.step(0, line=21)
    t.step(1, line=22)  # its params are not clipped: by design, another part of the model
    assert findings(t, "clip-misses-update") == []
