"""backward-in-evaluation (GD305): hand-written traces of a pass in eval mode with its own
backward, then train() and the update (analysis/modes.py, ``evaluation_backward``)."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "backward-in-evaluation"
DROPOUT = {"mid": 0, "name": "model.2", "cls": "Dropout", "layer": "dropout", "has_params": False,
           "frozen": False, "owned": False, "trainable": False, "updated": False,
           "track_running_stats": None, "momentum": None, "p": 0.1, "freeze": None}


def _forward(t, training, line, grad=True):
    t.event("mode_forward", line, training=training, grad=grad, inference=False, modules=[0],
            grad_modules=[0] if grad else [], calls=1, recalibrating=False, nested=False)


def _epochs(clear_first=True, train_after=True, input_gradient=False, validation_grad=True):
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1)
    t.event("mode_module", None, **DROPOUT)
    pending = False  # gradients left in .grad by the validation backward
    for epoch in range(3):
        if epoch == 0 or train_after:
            t.event("train", 10, mode=True, leaf=False, root="Sequential", frozen=False,
                    modules=[0], calls=1)
        for _ in range(2):
            if clear_first:
                t.clear([0, 1], line=12)
                pending = False
            _forward(t, True, 13)
            if pending:
                t.backward(accumulated=[0, 1], line=14)
            else:
                t.backward(fresh=[0, 1], line=14)
            t.step(line=15)
            if not clear_first:
                t.clear([0, 1], line=16)
            pending = False
        t.event("eval", 17, mode=False, leaf=False, root="Sequential", frozen=False, modules=[0],
                calls=1)
        _forward(t, False, 19, grad=validation_grad)
        if validation_grad:
            t.backward(fresh=[0, 1], line=20, extra_leaves=1 if input_gradient else 0)
            pending = True
    return t


def test_validation_gradients_the_next_step_applies_are_a_warning_at_that_backward():
    f = only(_epochs(clear_first=False), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 20
    assert "trains on this data" in f.message and f.evidence["backwards"] == 2  # the last: no step after


def test_silent_when_a_clear_throws_those_gradients_away_before_any_step():
    assert findings(_epochs(clear_first=True), SLUG) == []


def test_silent_without_train_after_it_for_an_input_gradient_and_under_no_grad():
    assert findings(_epochs(train_after=False), SLUG) == []  # no train(): train-in-eval-mode's
    assert findings(_epochs(input_gradient=True), SLUG) == []  # an attack's delta.grad
    assert findings(_epochs(validation_grad=False), SLUG) == []


def test_train_in_eval_mode_leaves_such_a_pass_to_this_rule():
    assert findings(_epochs(clear_first=False), "train-in-eval-mode") == []
    assert findings(_epochs(input_gradient=True), "train-in-eval-mode") == []
    assert findings(_epochs(train_after=False), "train-in-eval-mode") != []
