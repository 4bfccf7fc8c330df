"""loss-scale-not-undone (GD216) on hand-written traces: a loss times 2**k stepped by SGD with
nothing in between; silent for Adam, small or odd factors, and gradients divided before the step."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only


def update(t, factor, between=()):
    t.clear(P, line=10)
    t.backward(fresh=P, line=11, loss_scale_factor=factor, loss_terms=["mean"])
    for e in between:
        t.put(e, 12)
    t.step(0, line=13)


def test_undone_scale_is_a_warning_at_the_backward():
    t = builder()
    for _ in range(2):
        update(t, 1024.0)
    f = only(t, "loss-scale-not-undone")
    assert (f.location.line, f.severity) == (11, Severity.WARNING)
    assert [r.location.line for r in f.related] == [13]
    assert f.evidence["factor"] == 1024.0 and f.evidence["occurrences"] == 2


def test_divided_clipped_or_unscaled_grads_are_silent():
    t = builder()
    update(t, 1024.0, [ev.grad_edit(opt=0, params=list(P))])
    update(t, 1024.0, [ev.clip(via="clip_grad_norm_", params=list(P), with_grad=list(P),
                               untracked=0, limit=1.0, norm_type=2.0, norm_only=False,
                               total_norm=None, edited=[], spent=False)])
    update(t, 1024.0, [ev.unscale(scaler=0, opt=0, enabled=True, implicit=False, scale=1.0)])
    assert findings(t, "loss-scale-not-undone") == []


def test_weights_and_normalising_optimizers_are_silent():
    t = builder()
    for factor in (1.0, 256.0, 512.0, 1000.0, 0.5, None):
        update(t, factor)
    assert findings(t, "loss-scale-not-undone") == []
    t = builder(cls="Adam")
    update(t, 1024.0)
    assert findings(t, "loss-scale-not-undone") == []
