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
