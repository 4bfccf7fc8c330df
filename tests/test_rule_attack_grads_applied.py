"""attack-grads-applied (GD420): hand-written traces of adversarial training whose attack
backpropagates into the parameters' .grad (``extra_leaves``: the perturbation's gradient) before
the training loss's backward and the step (the ledger's windows)."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "attack-grads-applied"
P = [0, 1]


def _adversarial(updates=3, attack_steps=3, clear_before_attack=True, clear_after_attack=False,
                 input_gradient=True, closure=False):
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    for _ in range(updates):
        if clear_before_attack:
            t.clear(P, line=10)
        pending = not clear_before_attack and updates > 0
        for k in range(attack_steps):
            written = {"accumulated": P} if (k or pending) else {"fresh": P}
            t.backward(line=20, extra_leaves=1 if input_gradient else 0, in_step=0 if closure else None,
                       loss_scale_factor=1.0, loss_terms=["mean"], **written)
        if clear_after_attack:
            t.clear(P, line=30)
            t.backward(fresh=P, line=31, loss_scale_factor=1.0, loss_terms=["mean"])
        else:
            t.backward(accumulated=P, line=31, loss_scale_factor=1.0, loss_terms=["mean"])
        t.step(line=32)
    return t


def test_attack_gradients_the_step_applies_are_a_warning_at_the_clear_before_the_attack():
    f = only(_adversarial(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 10
    assert "3 times per update" in f.message and "in 3 updates" in f.message
    assert f.evidence == {"attack_backwards": 3, "updates": 3}


def test_without_any_clear_it_points_at_the_attack_backward():
    f = only(_adversarial(clear_before_attack=False), SLUG)
    assert f.location.line == 20 and "nothing clears them" in f.message


def test_silent_when_the_gradients_are_cleared_after_the_attack():
    assert findings(_adversarial(clear_after_attack=True), SLUG) == []


def test_silent_on_one_input_gradient_per_update_and_on_plain_accumulation():
    assert findings(_adversarial(attack_steps=1), SLUG) == []  # FGSM's clean half of the objective
    assert findings(_adversarial(input_gradient=False), SLUG) == []  # micro-batches: other rules'


def test_silent_on_a_single_update_and_on_a_closure():
    assert findings(_adversarial(updates=1), SLUG) == []
    assert findings(_adversarial(closure=True), SLUG) == []


def test_free_adversarial_training_is_silent():
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    for _ in range(6):
        t.clear(P, line=10)
        t.backward(fresh=P, line=20, extra_leaves=1)
        t.step(line=21)
    assert findings(t, SLUG) == []


def test_unscaled_accumulation_leaves_the_attack_steps_alone():
    assert findings(_adversarial(), "unscaled-accumulation") == []
    assert findings(_adversarial(input_gradient=False), "unscaled-accumulation") != []  # micro-batches


def test_a_clear_after_each_step_is_the_line_to_move_even_with_none_before_the_first_update():
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    for update in range(3):
        for k in range(3):
            written = {"accumulated": P} if k else {"fresh": P}
            t.backward(line=20, extra_leaves=1, **written)
        t.backward(accumulated=P, line=31)
        t.step(line=32)
        t.clear(P, line=33)
    assert only(t, SLUG).location.line == 33
