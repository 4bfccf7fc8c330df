"""step-before-backward (GD117) on hand-written traces: the loop-body layouts it reports (and
that misplaced-zero-grad then leaves to it), the look-alikes it stays silent on, and its edit."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Finding, Severity
from graddoctor.trace import Location, TraceBuilder
from rule_traces import P, only, slugs

SLUG = "step-before-backward"


def loop(order, n=6, lines=None, set_to_none=True):
    """One optimizer over P; each pass runs ``order`` (a string of c/s/b: clear, step,
    backward) at the given lines (default: in the order they are written)."""
    lines = lines or {k: 10 + i for i, k in enumerate(order)}
    t = TraceBuilder()
    t.optimizer(0, P, line=3)
    has_grad = False
    for _ in range(n):
        for k in order:
            if k == "c":
                t.clear(P, line=lines["c"])
                has_grad = not set_to_none and has_grad
            elif k == "s":
                t.step(0, line=lines["s"], without_grad=[] if has_grad else list(P))
            else:
                t.backward(fresh=P, line=lines["b"])
                has_grad = True
    return t.trace


def test_clear_step_backward_is_reported_at_the_step_not_the_clear():
    trace = loop("csb")  # zero_grad L10, step L11, backward L12
    assert slugs(trace) == [(SLUG, 11)]
    f = only(trace, SLUG)
    assert f.severity is Severity.ERROR
    assert "no gradient at all" in f.message and "line 12" in f.message
    assert [(r.location.line, r.note.split()[1]) for r in f.related] == [(12, "backward"), (10, "clear")]


def test_step_at_the_top_with_the_clear_after_backward_is_reported():
    assert slugs(loop("sbc")) == [(SLUG, 10)]


def test_zeroed_gradients_are_named_as_zeros():
    f = only(loop("csb", set_to_none=False), SLUG)
    assert "zeroed gradients" in f.message


def test_clear_between_backward_and_step_stays_misplaced_zero_grad():
    # the same cycle of calls, but the loop body reads backward → clear → step: the clear moves
    assert slugs(loop("bcs")) == [("misplaced-zero-grad", 11)]


def test_written_order_decides_not_the_cycle():
    # run as clear → step → backward, but written backward (L10), clear (L11), step (L12): the
    # turns read backward → clear → step (the first pass skipped its backward), the clear moves
    assert slugs(loop("csb", lines={"b": 10, "c": 11, "s": 12})) == [("misplaced-zero-grad", 11)]


def test_step_first_then_clear_is_a_delayed_update_and_silent():
    assert slugs(loop("scb")) == []


def test_ordinary_loop_is_silent():
    assert slugs(loop("cbs")) == []
    assert slugs(loop("bsc")) == []


def test_step_with_a_closure_is_silent():
    t = TraceBuilder()
    t.optimizer(0, P, line=3, cls="LBFGS")
    for _ in range(5):
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, closure=True), 20)
        for _ in range(3):
            t.clear(P, line=6)
            t.backward(fresh=P, line=8, in_step=0)
        t.step(0, line=20, closure=True)
    assert slugs(t.trace) == []


def test_gan_updates_each_with_its_own_backward_are_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    t.optimizer(1, [1], line=4)
    for _ in range(5):
        t.clear([0], opt=0, line=10)
        t.backward(fresh=[0, 1], line=11)
        t.step(0, line=12)
        t.clear([1], opt=1, line=13)
        t.backward(fresh=[1], accumulated=[0], line=14)
        t.step(1, line=15)
    assert [s for s in slugs(t.trace) if s[0] in (SLUG, "misplaced-zero-grad")] == []


def test_accumulation_is_silent():
    t = TraceBuilder()
    t.optimizer(0, P, line=3)
    for i in range(8):
        t.backward(fresh=P if i % 4 == 0 else (), accumulated=P if i % 4 else (), line=10,
                   loss_scale_factor=0.25)
        if i % 4 == 3:
            t.step(0, line=12)
            t.clear(P, line=13)
    assert slugs(t.trace) == []


def _fix(tmp_path, body):
    from graddoctor.rules.source import Source
    from graddoctor.rules.step_before_backward import StepBeforeBackward
    from graddoctor.findings import Related, Role

    text = "for x in data:\n" + body
    src = Source("train.py", str(tmp_path / "train.py"), text)
    lines = text.splitlines()
    step = next(n for n, ln in enumerate(lines, 1) if ".step()" in ln)
    back = next(n for n, ln in enumerate(lines, 1) if ".backward()" in ln)
    finding = Finding(rule=SLUG, code="GD117", severity=Severity.ERROR, message="",
                      location=Location("train.py", step),
                      related=(Related(Location("train.py", back),
                                       "the backward whose gradients no step uses",
                                       (Role.BACKWARD,)),))
    fix = StepBeforeBackward().autofix(finding, src)
    if fix is None:
        return None
    from graddoctor.edits import apply_edits

    return apply_edits(text, list(fix.edits))


def test_the_edit_moves_the_step_after_the_backward(tmp_path):
    fixed = _fix(tmp_path, "    opt.zero_grad()\n    loss = f(x)\n    opt.step()  # note\n"
                           "    loss.backward()\n")
    assert fixed == ("for x in data:\n    opt.zero_grad()\n    loss = f(x)\n    loss.backward()\n"
                     "    opt.step()  # note\n")


def test_no_edit_when_step_and_backward_are_in_different_blocks(tmp_path):
    assert _fix(tmp_path, "    opt.zero_grad()\n    if ok:\n        opt.step()\n"
                          "    loss.backward()\n") is None


def _helper_loop(order):
    """Like ``loop``, with the backward at L6 inside the script's helper ``backprop``: the turns
    cut at its earlier line, so the loop's first pass decides."""
    t = TraceBuilder()
    t.optimizer(0, P, line=3)
    at = {"c": 12, "s": 14}
    for _ in range(6):
        for k in order:
            if k == "b":
                t.trace.put(ev.backward(fresh=list(P), accumulated=[], cleared_outside=[]),
                            Location(t.path, 6, "backprop"))
            elif k == "c":
                t.clear(P, line=at["c"])
            else:
                t.step(0, line=at["s"])
    return t.trace


def test_backward_in_a_helper_called_after_the_step_is_reported():
    trace = _helper_loop("csb")
    assert slugs(trace) == [(SLUG, 14)]
    assert only(trace, SLUG).evidence["backward_function"] == "backprop"


def test_backward_in_a_helper_then_clear_then_step_stays_misplaced_zero_grad():
    assert slugs(_helper_loop("bcs")) == [("misplaced-zero-grad", 12)]


def test_the_edit_moves_the_step_after_the_helper_call(tmp_path):
    from graddoctor.edits import apply_edits
    from graddoctor.findings import Related, Role
    from graddoctor.rules.source import Source
    from graddoctor.rules.step_before_backward import StepBeforeBackward

    text = ("def backprop(loss):\n    loss.backward()\n\n\nfor x in data:\n    opt.zero_grad()\n"
            "    loss = f(x)\n    opt.step()\n    log(loss)\n    backprop(loss)\n")
    src = Source("train.py", str(tmp_path / "train.py"), text)
    finding = Finding(rule=SLUG, code="GD117", severity=Severity.ERROR, message="",
                      location=Location("train.py", 8), evidence={"backward_function": "backprop"},
                      related=(Related(Location("train.py", 2), "the backward whose gradients no step uses",
                                       (Role.BACKWARD,)),))
    fix = StepBeforeBackward().autofix(finding, src)
    assert apply_edits(text, list(fix.edits)).endswith(
        "    loss = f(x)\n    log(loss)\n    backprop(loss)\n    opt.step()\n")
