"""accumulation-divided-twice (GD227) over hand-written traces: a window of k backwards whose
single mean-reduced loss reaches backward multiplied by exactly 1/k², and the look-alikes."""

from __future__ import annotations

import pytest

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from rule_traces import builder, clip, findings, only

SLUG = "accumulation-divided-twice"


def _windows(t, k=4, factor=None, terms=("mean",), steps=3, clipped=False, closure=False):
    factor = 1.0 / (k * k) if factor is None else factor
    for _ in range(steps):
        t.clear([0, 1], line=10)
        for i in range(k):
            inside = closure and i == k - 1
            t.backward(fresh=[0, 1] if i == 0 else (), accumulated=[0, 1] if i else (), line=12,
                       loss_scale_factor=factor, loss_terms=list(terms),
                       **({"in_step": 0} if inside else {}))
        if clipped:
            clip(t, line=13)
        t.step(0, line=14, closure=closure)
    return t


def test_a_loss_divided_by_k_twice_is_a_warning_at_the_backward_with_sgd():
    f = only(_windows(builder("SGD")), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 12
    assert f.evidence["k"] == 4 and "1/16" in f.message and "4x smaller learning rate" in f.message


def test_adam_cancels_the_factor_unless_gradients_are_clipped():
    assert only(_windows(builder("AdamW")), SLUG).severity == Severity.INFO
    f = only(_windows(builder("AdamW"), clipped=True), SLUG)
    assert f.severity == Severity.WARNING and "clip threshold is 4x looser" in f.message


@pytest.mark.parametrize("kw", [
    {"factor": 0.25},  # divided once
    {"factor": 1.0},  # not divided (unscaled-accumulation's finding)
    {"terms": ("sum",)},  # a summed loss divided by the batch size and by k
    {"terms": ("mean", "mean")},  # two terms averaged, then divided by k
    {"terms": (None,)},  # a loss whose reduction is unknown
    {"k": 1, "factor": 1.0},
])
def test_silent_on_look_alikes(kw):
    assert findings(_windows(builder("SGD"), **kw), SLUG) == []


def test_a_closure_step_that_ran_one_backward_ends_a_window():
    """Lightning's automatic optimization steps with a closure that runs the window's last
    backward; L-BFGS's closure re-evaluates the loss several times and ends no window."""
    t = _windows(builder("SGD"), closure=True)
    assert [w.k for w in Analysis(t.trace).windows[0]] == [4, 4, 4]
    assert only(t, SLUG).location.line == 12
    lbfgs = builder("LBFGS")
    for _ in range(2):
        lbfgs.clear([0, 1], line=10)
        for i in range(3):
            lbfgs.backward(fresh=[0, 1] if i == 0 else (), accumulated=[0, 1] if i else (),
                           line=12, in_step=0)
        lbfgs.step(0, line=14, closure=True)
    assert Analysis(lbfgs.trace).windows == {}
