"""optimizer-never-steps (GD107) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only, plain_update


def test_optimizer_never_steps_is_silent_on_an_inner_optimizer_a_wrapper_steps():
    t = TraceBuilder()
    t.optimizer(0, P, line=1, cls="SGD")        # the inner optimizer
    t.optimizer(1, P, line=1, cls="Lookahead")  # the wrapper over the same parameters
    for _ in range(3):
        plain_update(t, opt=1)
    t.put(ev.run_end(status="completed", steps=3))
    assert findings(t, "optimizer-never-steps") == []
    t = TraceBuilder()  # a second optimizer whose parameters nothing steps is still found
    t.optimizer(0, P, line=1)
    t.optimizer(1, [0], line=2)
    for _ in range(3):
        t.backward(fresh=P, line=11)
        t.step(1, line=12)
    t.put(ev.run_end(status="completed", steps=3))
    assert only(t, "optimizer-never-steps").location.line == 1


def _gan(t, d_cleared=True, steps=3):
    t.optimizer(0, [0], line=1, cls="Adam")  # the generator's
    t.optimizer(1, [1], line=2, cls="Adam")  # the discriminator's
    for _ in range(steps):
        if d_cleared:
            t.clear([1], opt=1, line=10)
        t.backward(fresh=[1], line=11)       # D's loss
        # (opt_d.step() dropped here)
        t.clear([0], opt=0, line=13)
        t.backward(fresh=[0], line=14)       # G's loss
        t.step(0, line=15)
    t.put(ev.run_end(status="completed", steps=steps))


def test_a_dropped_step_of_one_of_two_cleared_optimizers_points_at_its_backward():
    t = TraceBuilder()
    _gan(t)
    f = only(t, "optimizer-never-steps")
    assert f.location.line == 11 and f.severity.value == "warning"
    assert [r.location.line for r in f.related][:1] == [2]  # the optimizer's construction


def test_an_optimizer_never_cleared_nor_stepped_points_at_its_construction():
    t = TraceBuilder()
    _gan(t, d_cleared=False)
    assert only(t, "optimizer-never-steps").location.line == 2


def _late_loop(t, fed: int, status: str):
    """900 backwards of hand-written updates into [0, 1] (no optimizer), then a torch optimizer over
    [2, 3] whose own loop had run ``fed`` backwards when the run stopped with ``status``."""
    t.optimizer(0, [2, 3], line=40, cls="Adam")
    for _ in range(900):
        t.backward(fresh=[0, 1], line=20)
    for _ in range(fed):
        t.clear([2, 3], opt=0, line=44)
        t.backward(fresh=[2, 3], line=45)
    t.put(ev.run_end(status=status, steps=0))


def test_an_optimizer_whose_loop_starts_as_the_run_is_cut_is_not_judged():
    """d2l's optimization chapter: hand-written Adam/RMSProp/Adagrad over 900 batches, then
    ``train_concise_ch11`` with torch.optim.Adam; the backward budget ended right after its first
    backward, before its first step."""
    t = TraceBuilder()
    _late_loop(t, fed=1, status="backward-limit")
    assert findings(t, "optimizer-never-steps") == []
    t = TraceBuilder()  # the same optimizer filled by many backwards and never stepped is found,
    _late_loop(t, fed=12, status="backward-limit")  # with the backwards that filled it counted
    f = only(t, "optimizer-never-steps")
    assert f.location.line == 40 and f.evidence["backward_calls"] == 12
    t = TraceBuilder()  # a run that completed is judged whatever the count
    _late_loop(t, fed=1, status="completed")
    assert only(t, "optimizer-never-steps").location.line == 40
