"""optimizers-swapped (GD161) on hand-written traces: two optimizers each stepped after the
other one's backward, and the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.trace import TraceBuilder
from rule_traces import findings, slugs

G, D = [0, 1], [2, 3]  # optimizer 0 trains G, optimizer 1 trains D


def gan() -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, G, line=1)
    t.optimizer(1, D, line=2)
    return t


def crossed_gan(t, turns=3, cleared_before_step=False):
    """The generator's loss reaches G and D and is followed by D's step; the discriminator's
    loss reaches D only and is followed by G's step."""
    for i in range(turns):
        t.clear(G, opt=0, line=10)
        t.backward(fresh=G + D if i == 0 else G, accumulated=[] if i == 0 else D, line=11)
        t.step(1, line=12)
        t.clear(D, opt=1, line=13)
        if cleared_before_step:
            t.clear(G, opt=0, line=14)
        t.backward(fresh=D, line=15)
        t.step(0, line=16, without_grad=G if cleared_before_step else [])
    return t


def test_both_crossed_steps_are_reported_and_nothing_else():
    assert slugs(crossed_gan(gan()).trace) == [("optimizers-swapped", 12), ("optimizers-swapped", 16)]


def test_the_starved_step_says_what_it_applies():
    stale = {f.location.line: f for f in findings(crossed_gan(gan()), "optimizers-swapped")}
    assert "held from an earlier update" in stale[16].message
    empty = {f.location.line: f for f in findings(crossed_gan(gan(), cleared_before_step=True),
                                                  "optimizers-swapped")}
    assert "no gradient at all" in empty[16].message
    assert empty[16].evidence["starved"] and not empty[12].evidence["starved"]


def test_a_crossing_seen_once_without_its_second_half_is_not_reported():
    t = gan()
    t.clear(D, opt=1, line=13)
    t.backward(fresh=D, line=15)
    t.step(0, line=16)  # starved, but the run ends before D steps
    assert findings(t, "optimizers-swapped") == []


def test_a_critic_stepped_five_times_per_generator_step_is_silent():
    t = gan()
    for i in range(10):
        t.clear(D, opt=1, line=10)
        t.backward(fresh=D, line=11)
        t.step(1, line=12)
        if i % 5 == 4:
            t.clear(G, opt=0, line=13)
            t.backward(fresh=G, accumulated=D, line=14)
            t.step(0, line=15)
    assert slugs(t.trace) == []


def test_an_optimizer_stepped_without_gradient_next_to_the_one_that_got_it_is_silent():
    t = gan()
    for i in range(6):
        t.clear(G, opt=0, line=10)
        t.clear(D, opt=1, line=11)
        t.backward(fresh=G if i % 2 else G + D, line=12)  # D used every other turn
        t.step(1, line=13, without_grad=D if i % 2 else [])
        t.step(0, line=14)
    assert findings(t, "optimizers-swapped") == []


def test_the_other_optimizer_stepping_in_the_late_phase_too_is_silent():
    # G's optimizer steps after every backward: nothing G gets waits for a step of D's
    t = gan()
    for _ in range(3):
        t.clear(G + D, opt=None, line=10)
        t.backward(fresh=D, line=11)
        t.step(0, line=12, without_grad=G)
        t.backward(fresh=G + D, line=13)
        t.step(0, line=14)
        t.step(1, line=15)
    assert findings(t, "optimizers-swapped") == []


def test_optimizers_over_shared_parameters_are_not_crossed():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1)
    t.optimizer(1, [1, 2], line=2)
    for _ in range(3):
        t.clear([0, 1, 2], opt=None, line=10)
        t.backward(fresh=[2], line=11)
        t.step(0, line=12)
        t.backward(fresh=[0], line=13)
        t.step(1, line=14)
    assert findings(t, "optimizers-swapped") == []


def test_closure_and_skipped_steps_do_not_count():
    t = gan()
    for _ in range(3):
        t.clear(G, opt=0, line=10)
        t.backward(fresh=G, accumulated=D, line=11)
        t.step(1, line=12, skipped=True)
        t.clear(D, opt=1, line=13)
        t.backward(fresh=D, line=15)
        t.step(0, line=16, skipped=True)
    assert findings(t, "optimizers-swapped") == []


def test_a_starved_step_whose_phase_gradient_was_stepped_is_silent():
    # B steps without a gradient next to A, which applies the phase's gradient; B's own
    # gradient then accumulates over two backwards before its step
    t = TraceBuilder()
    t.optimizer(0, G, line=1)
    t.optimizer(1, D, line=2)
    for _ in range(3):
        t.clear(G + D, opt=None, line=10)
        t.backward(fresh=G, line=11)
        t.step(0, line=12)
        t.step(1, line=13, without_grad=D)
        t.backward(fresh=D, accumulated=G, line=14)
        t.step(0, line=15)
        t.backward(accumulated=D, line=16)
        t.step(1, line=17)
    assert findings(t, "optimizers-swapped") == []
