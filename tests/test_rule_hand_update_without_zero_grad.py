"""hand-update-without-zero-grad (GD120): hand-written traces, and what the backward watcher
records of tensors no optimizer owns (``applied_by_hand``)."""

from __future__ import annotations

import torch

from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "hand-update-without-zero-grad"


def _hand_loop(applied=(0, 1), backwards=4) -> TraceBuilder:
    t = TraceBuilder()
    t.param(0, "w")
    t.param(1, "b")
    t.backward(fresh=[0, 1], line=9)
    for _ in range(backwards - 1):
        t.backward(accumulated=[0, 1], line=9, applied_by_hand=list(applied) or None)
    return t


def test_a_backward_adding_onto_applied_gradients_is_an_error_at_that_backward():
    f = only(_hand_loop(), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 9
    assert "b, w" in f.message and "already applied" in f.message
    assert f.evidence == {"params": ["b", "w"], "backwards": 3}
    assert "b.grad.zero_(); w.grad.zero_()" in f.fix  # in the script's own names


def test_module_parameters_get_the_module_s_zero_grad_as_fix():
    t = TraceBuilder()
    t.param(0, "model.weight")
    t.param(1, "model.bias")
    t.backward(fresh=[0, 1], line=5)
    t.backward(accumulated=[0, 1], line=5, applied_by_hand=[0, 1])
    assert "model.zero_grad()" in only(t, SLUG).fix


def test_silent_when_what_the_backward_added_is_cleared_before_the_next_update():
    # a PGD attack's backwards add onto the model's applied gradients; model.zero_grad() and
    # the training backward come before the model's next update
    t = TraceBuilder()
    t.param(0, "model.weight")
    for _ in range(3):
        t.backward(accumulated=[0], line=20, applied_by_hand=[0], updated_by_hand=[0])
        t.backward(accumulated=[0], line=20)
        t.clear([0], line=22)
        t.backward(fresh=[0], line=24)
    assert findings(t, SLUG) == []
    t.backward(accumulated=[0], line=20, applied_by_hand=[0], updated_by_hand=[0])
    t.backward(accumulated=[0], line=20, updated_by_hand=[0])  # then updated again: applied
    assert only(t, SLUG).location.line == 20


def test_silent_without_applied_gradients_and_with_an_optimizer_loop():
    assert findings(_hand_loop(applied=()), SLUG) == []
    t = builder()
    for _ in range(3):
        t.backward(accumulated=[0, 1], line=11)
        t.step(line=12)
    assert findings(t, SLUG) == []


def _record(body) -> list:
    """The ``applied_by_hand`` of each backward ``body()`` runs under the instrumentation."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        body()
    return [e.get("applied_by_hand") for e in rec.trace.of_kind("backward")]


def _linear_fit(update, zero=False, accumulate=1, steps=6):
    def body():
        torch.manual_seed(0)
        x = torch.randn(16, 3)
        y = x.sum(1, keepdim=True)
        w = torch.zeros(3, 1, requires_grad=True)
        for i in range(steps):
            ((x @ w - y) ** 2).mean().backward()
            if (i + 1) % accumulate:
                continue
            update(w)
            if zero:
                w.grad = None
    return body


def _in_place(w):
    with torch.no_grad():
        w -= 0.1 * w.grad


def _through_data(w):  # bypasses the version counter: seen by the tensor's norm
    w.data -= 0.1 * w.grad.data


def test_updates_in_place_and_through_data_are_seen_once_the_tensor_is_tracked():
    # the tensor is tracked on its second backward (a plain tensor, not a Parameter); from the
    # third on each backward adds onto gradients the update applied
    for update in (_in_place, _through_data):
        assert _record(_linear_fit(update)) == [None, None, [0], [0], [0], [0]]


def test_nothing_when_the_gradient_is_cleared_or_accumulated_between_updates():
    assert _record(_linear_fit(_in_place, zero=True)) == [None] * 6
    # two backwards per update, no clear: only the first backward after each update adds onto
    # applied gradients
    assert _record(_linear_fit(_in_place, accumulate=2, steps=8)) == \
        [None, None, [0], None, [0], None, [0], None]


def test_a_gradient_rescaled_after_the_update_is_meant_and_not_reported():
    def momentum(w):
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad.mul_(0.9)
    assert _record(_linear_fit(momentum)) == [None] * 6


def test_a_backward_that_does_not_write_the_tensor_does_not_report_it():
    def body():
        torch.manual_seed(0)
        w = torch.zeros(3, requires_grad=True)
        v = torch.ones(3, requires_grad=True)
        for _ in range(4):
            (w * 2).sum().backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
            (v * 3).sum().backward()  # w's applied gradient stays, but this backward leaves it
            v.grad = None
    assert [r for r in _record(body)] == [None, None, None, None, [0], None, [0], None]


def test_tensors_an_optimizer_owns_are_left_to_missing_zero_grad_and_cost_nothing():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as instrumentation:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
        marks = dict(instrumentation.backward._marks)
    assert [e.get("applied_by_hand") for e in rec.trace.of_kind("backward")] == [None] * 4
    assert marks == {}  # every tracked tensor has an optimizer: nothing read, nothing kept


def _zeroed_through_data(w):
    with torch.no_grad():
        w -= 0.1 * w.grad
    w.grad.data.zero_()  # no version moves: only the values tell


def test_gradients_zeroed_through_data_are_cleared_not_applied():
    assert _record(_linear_fit(_zeroed_through_data)) == [None] * 6


def test_after_a_step_a_gradient_zeroed_through_data_is_a_clear_and_one_kept_accumulates():
    def verdicts(clear):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            model = torch.nn.Linear(3, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.randn(4, 3)).sum().backward()
                opt.step()
                clear(model)
        return [(e["accumulated"], e["cleared_outside"]) for e in rec.trace.of_kind("backward")]

    def through_data(model):
        for p in model.parameters():
            p.grad.data.zero_()

    assert verdicts(through_data) == [([], []), ([], [0, 1]), ([], [0, 1])]
    assert verdicts(lambda model: None) == [([], []), ([0, 1], []), ([0, 1], [])]


def test_a_change_that_does_not_follow_the_gradient_applied_nothing():
    """A tensor copied from another (a target network reloaded from the model it serves) or
    moved at random changed, but no update applied its gradient: its grads summing up is
    wasted work, not a wrong update."""
    source = torch.randn(3, 1)

    def reload(w):
        with torch.no_grad():
            w.copy_(source + 0.1 * torch.randn(3, 1))

    assert _record(_linear_fit(reload)) == [None] * 6

    def ascend(w):  # an attack's ascent applies its gradient too
        with torch.no_grad():
            w += 0.1 * w.grad.sign()
    assert _record(_linear_fit(ascend)) == [None, None, [0], [0], [0], [0]]


def test_follows_gradients_measures_the_cosine_of_the_change_with_the_gradient():
    from graddoctor.instrument.backward import _follows_gradients

    g = torch.randn(64)
    assert _follows_gradients([(-0.1 * g, g)])  # SGD
    assert _follows_gradients([(-0.01 * g.sign(), g)])  # sign / Adam-like
    assert not _follows_gradients([(torch.randn(64, generator=torch.Generator().manual_seed(3)), g)])
    assert _follows_gradients([(torch.zeros(64), g)])  # nothing to judge by: as before
