"""added-group-frozen (GD141): a param group added to an optimizer that already stepped, whose
parameters were frozen when first seen and got no gradient afterwards, over hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "added-group-frozen"


def _trace(*, frozen=True, written_later=False, later_steps=2, late=True):
    t = TraceBuilder()
    t.param(0, "head.weight")
    t.param(1, "backbone.weight", requires_grad=not frozen)
    t.param(2, "backbone.bias", requires_grad=not frozen)
    t.optimizer(0, [0], line=3, cls="Adam")
    if not late:
        t.optimizer(0, [1, 2], line=4, cls="Adam")
    t.clear([0], line=10)
    t.backward(fresh=[0], line=11)
    t.step(line=12)
    if late:
        t.optimizer(0, [1, 2], line=8, cls="Adam")
    for _ in range(later_steps):
        t.clear([0, 1, 2], line=10)
        t.backward(fresh=[0, 1, 2] if written_later else [0], line=11)
        t.step(line=12)
    return t


def test_a_late_group_of_frozen_parameters_that_never_get_a_gradient_is_a_warning():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 8
    assert "2 parameters" in f.message and "never trains" in f.message


def test_unfrozen_groups_groups_built_with_the_optimizer_and_short_tails_are_silent():
    assert findings(_trace(frozen=False), SLUG) == []
    assert findings(_trace(written_later=True), SLUG) == []  # unfrozen after all
    assert findings(_trace(late=False), SLUG) == []  # frozen for now, given at construction
    assert findings(_trace(later_steps=1), SLUG) == []  # one update after it: too little
