"""custom-backward-wrong (GD234): hand-written traces, and the Function.apply watcher
in-process: a wrong backward is found with its factor, a correct one, a gradient-reversal layer
and a straight-through estimator are not, and the script's RNG stream and outputs are as
without graddoctor."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "custom-backward-wrong"


def test_a_sign_flip_is_named_at_the_backward():
    t = TraceBuilder()
    t.put(ev.custom_backward(cls="MyTanh", input=0, ratio=-1.0, forward=["train.py", 20]), 8)
    f = only(t, SLUG)
    assert f.location.line == 8 and "opposite sign" in f.message and "first input" in f.message
    assert f.related[0].location.line == 20


def test_a_factor_and_a_non_proportional_gradient_are_named():
    t = TraceBuilder()
    t.put(ev.custom_backward(cls="Sq", input=1, ratio=0.5, forward=None), 8)
    t.put(ev.custom_backward(cls="Mul", input=0, ratio=None, forward=None), 18)
    found = findings(t, SLUG)
    assert "0.5 times" in found[0].message and "second input" in found[0].message
    assert "not proportional" in found[1].message


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):  # wrong: d(x²)/dx is 2x
        (x,) = ctx.saved_tensors
        return g * x


class GoodSquare(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class DropScale(torch.autograd.Function):  # draws random numbers in its forward
    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask * 2

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask * 2


class Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -g


class Ste(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


def run(fn):
    torch.manual_seed(0)
    x = torch.randn(6, 3, requires_grad=True)
    out = fn.apply(x)
    out.sum().backward()
    return out.detach(), x.grad, torch.rand(2)


def checked(fn):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        got = run(fn)
    return got, [e for e in rec.trace if e.kind == "custom_backward"]


def test_the_watcher_finds_the_factor_and_changes_nothing():
    expected = run(Square)
    got, events = checked(Square)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    (e,) = events
    assert e.get("cls") == "Square" and abs(e.get("ratio") - 0.5) < 1e-6
    assert e.loc.line > 0


def test_a_random_forward_keeps_the_stream_and_a_correct_backward_is_silent():
    expected = run(DropScale)
    got, events = checked(DropScale)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and events == []


def test_correct_reversal_and_straight_through_are_silent():
    for fn in (GoodSquare, Reverse, Ste):
        _, events = checked(fn)
        assert events == [], fn


# --- an identity forward whose backward passes the gradient through: a reversal without its minus


def test_a_pass_through_named_a_reversal_is_a_reversal_missing_its_minus():
    t = TraceBuilder()
    t.put(ev.custom_backward(cls="ReverseLayerF", input=0, ratio=0.7, forward=["train.py", 30],
                             identity=True, names=["ReverseLayerF", "<module>", "h"]), 8)
    f = only(t, SLUG)
    assert "gradient reversal" in f.message and "minus sign is missing" in f.message
    assert "times 0.7" in f.message and f.severity.name == "WARNING"
    assert f.fix.startswith("negate the gradient")
    assert f.evidence["named"] == "ReverseLayerF"


def test_the_reversal_may_be_named_by_the_caller_or_a_comment():
    for names in (["_Fn", "grad_reverse", "x"], ["Identity", "<module>", "h", "GRL"],
                  ["Pass", "DANN.forward", "h", "reverse", "the", "gradient"]):
        t = TraceBuilder()
        t.put(ev.custom_backward(cls=names[0], input=0, ratio=1.0, forward=None, identity=True,
                                 names=names), 8)
        assert "unchanged" in only(t, SLUG).message, names


def test_a_pass_through_nothing_calls_a_reversal_is_silent():
    # gradient scaling (fairseq's GradMultiply), a gradient recorder, a reversible block
    for names in (["GradMultiply", "<module>", "f"], ["RecordGradNorm", "<module>", "h"],
                  ["ReversibleBlockFn", "RevNet.forward", "y"], ["ScaleGrad", "<module>", "x"]):
        t = TraceBuilder()
        t.put(ev.custom_backward(cls=names[0], input=0, ratio=0.1, forward=None, identity=True,
                                 names=names), 8)
        assert findings(t, SLUG) == [], names


def _fix(source: str, index: int = 0):
    import ast
    from graddoctor.rules.custom_backward_wrong import _reversal_fix
    tree = ast.parse(source)
    line = next(n.lineno for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    return _reversal_fix(tree, line, index)


def test_the_fix_negates_the_returned_gradient_at_its_line():
    assert _fix("def backward(ctx, g):\n    return g * ctx.alpha, None\n") == \
        (2, "return -g * ctx.alpha, None")
    assert _fix("def backward(ctx, g):\n    return g\n") == (2, "return -g")
    assert _fix("def backward(ctx, g):\n    out = g + 0\n    return out + g, None\n") == \
        (3, "return -(out + g), None")
    assert _fix("def backward(ctx, a, g):\n    return None, g.clone()\n", 1) == \
        (2, "return None, -g.clone()")


def test_a_gradient_computed_only_when_needed_is_negated_where_it_is_computed():
    source = ("def backward(ctx, g):\n"
              "    dx = None\n"
              "    if ctx.needs_input_grad[0]:\n"
              "        dx = ctx.lam * g\n"
              "    return dx, None\n")
    assert _fix(source) == (4, "dx = -ctx.lam * g")


class GradReverse(torch.autograd.Function):  # the minus sign is missing
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.alpha, None


class GoodReverse(GradReverse):
    @staticmethod
    def backward(ctx, g):
        return g.neg() * ctx.alpha, None


calls = []


class Inspect(torch.autograd.Function):  # identity both ways; its backward has a side effect
    @staticmethod
    def forward(ctx, x, alpha):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        calls.append(float(g.norm()))
        return g, None


def run_schedule(fn, alphas):
    torch.manual_seed(0)
    w = torch.randn(6, 3, requires_grad=True)
    for alpha in alphas:
        out = fn.apply(w * 2, alpha)
        (out * torch.arange(3.0)).sum().backward()
    return w.grad.clone()


def checked_schedule(fn, alphas):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        got = run_schedule(fn, alphas)
    return got, [e for e in rec.trace if e.kind == "custom_backward"]


def test_the_pass_through_is_read_from_the_run_once_a_scheduled_alpha_leaves_zero():
    expected = run_schedule(GradReverse, [0.0, 0.0, 0.25])
    got, events = checked_schedule(GradReverse, [0.0, 0.0, 0.25])
    assert torch.equal(got, expected)
    (e,) = events
    assert e.get("identity") and abs(e.get("ratio") - 0.25) < 1e-9 and e.get("input") == 0
    assert "GradReverse" in e.get("names") and "run_schedule" in e.get("names")


def test_a_negated_backward_and_a_zero_gradient_record_nothing():
    assert checked_schedule(GoodReverse, [0.0, 0.5, 1.0])[1] == []
    assert checked_schedule(GradReverse, [0.0] * 12)[1] == []  # never a sign to read


def test_the_backward_runs_only_as_often_as_the_script_asks():
    calls.clear()
    _, events = checked_schedule(Inspect, [1.0, 1.0])
    assert len(calls) == 2  # no extra backward of graddoctor's
    (e,) = events
    assert e.get("ratio") == 1.0 and "Inspect" in e.get("names")


def test_the_backward_return_and_an_unread_incoming_gradient():
    import ast
    from graddoctor.rules.custom_backward_wrong import _backward_return
    dropped = ast.parse("class F:\n    def backward(ctx, grad_output):\n        (x,) = ctx.saved_tensors\n"
                        "        return (x > 0).to(grad_output.dtype)\n")
    assert _backward_return(dropped, 2) == (4, "grad_output")
    kept = ast.parse("class F:\n    def backward(ctx, g):\n        (x,) = ctx.saved_tensors\n"
                     "        return g * (x > 0)\n")
    assert _backward_return(kept, 2) == (4, None)
    two = ast.parse("class F:\n    def backward(ctx, g):\n        if g is None:\n            return None\n"
                    "        return g\n")
    assert _backward_return(two, 2) == (None, None)


def test_a_backward_that_ignores_the_incoming_gradient_is_told_so():
    from graddoctor import events as ev
    from rule_traces import builder, only
    t = builder()
    t.put(ev.custom_backward(cls="BinarizeSTE", input=0, ratio=None, forward=None, ignores_grad=True), 5)
    f = only(t, "custom-backward-wrong")
    assert "the same gradient whatever gradient arrives from the loss" in f.message
    assert "finite differences" not in f.message  # a straight-through estimator is not compared
    assert "ignores_grad" not in ev.custom_backward(cls="F", input=0, ratio=1.0, forward=None)[1]


def test_a_gradient_in_the_slot_of_an_input_without_one_is_named_at_the_return():
    t = TraceBuilder()
    t.put(ev.custom_backward(cls="FakeQuant", input=0, ratio=None, forward=["train.py", 40],
                             given_to=1), 8)
    f = only(t, SLUG)
    assert f.location.line == 8 and "returns None for its first input" in f.message
    assert "second input, which needs none" in f.message
    assert f.evidence["given_to"] == 1 and f.related[0].location.line == 40


class SlotsOutOfOrder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return torch.round(x / scale) * scale

    @staticmethod
    def backward(ctx, g):
        return None, g


class ScaleFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scale, x):
        return torch.round(x / scale) * scale

    @staticmethod
    def backward(ctx, g):
        return None, g


def _applied(fn, scale_first):
    torch.manual_seed(0)
    x = torch.randn(6, 3, requires_grad=True)
    scale = torch.tensor(0.25)
    out = fn.apply(scale, x) if scale_first else fn.apply(x, scale)
    out.sum().backward()
    return out.detach(), x.grad


def test_the_watcher_finds_a_return_tuple_out_of_forward_order_and_changes_nothing():
    plain = _applied(SlotsOutOfOrder, False)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        got = _applied(SlotsOutOfOrder, False)
    events = [e for e in rec.trace if e.kind == "custom_backward"]
    assert torch.equal(plain[0], got[0]) and plain[1] is None and got[1] is None
    assert len(events) == 1 and events[0].get("input") == 0 and events[0].get("given_to") == 1


def test_a_return_tuple_that_follows_forward_order_is_not_reported():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _applied(ScaleFirst, True)
    assert not [e for e in rec.trace if e.kind == "custom_backward"]


def test_the_fix_swaps_the_two_slots_of_the_last_return():
    import ast
    from graddoctor.rules.custom_backward_wrong import _swapped_return
    src = ("class F:\n"
           "    @staticmethod\n"
           "    def backward(ctx, g):\n"
           "        return None, g * 2, None\n")
    assert _swapped_return(ast.parse(src), 3, 0, 1) == (4, "return g * 2, None, None")


class ReverseByAlpha(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


def _reversed(h, cut):
    outs = []
    for _ in range(3):
        outs.append(ReverseByAlpha.apply(h.detach(), 0.5) if cut else ReverseByAlpha.apply(h * 1.0, 0.5))
    return outs


def test_a_reversal_on_a_detached_tensor_is_recorded_at_the_cutting_line():
    h = torch.randn(4, 3, requires_grad=True)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        outs = _reversed(h, True)
    assert all(not o.requires_grad and torch.equal(o, h.detach()) for o in outs)
    events = [e for e in rec.trace if e.kind == "custom_backward"]
    assert len(events) == 1 and events[0].get("input_cut") and events[0].get("identity")
    assert ".detach()" in open(__file__).read().splitlines()[events[0].loc.line - 1]


def test_a_reversal_with_its_gradient_or_on_plain_data_is_not_recorded():
    h = torch.randn(4, 3, requires_grad=True)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _reversed(h, False)
        for _ in range(3):
            ReverseByAlpha.apply(torch.randn(4, 3), 0.5)
    assert not [e for e in rec.trace if e.kind == "custom_backward" and e.get("input_cut")]


def test_the_cut_input_finding_names_the_reversal():
    t = TraceBuilder()
    t.put(ev.custom_backward(cls="GradReverse", input=0, ratio=None, forward=["train.py", 12],
                             identity=True, names=["GradReverse"], input_cut=True), 30)
    f = only(t, SLUG)
    assert f.location.line == 30 and "needs no gradient" in f.message and "backward never runs" in f.message


# -- a step forward whose surrogate backward is no bump at the step -----------------------------

def _surrogate(backward, step_at=0.0, reach=3.0):
    """``_surrogate_off_step`` for a spike at ``step_at`` whose backward is ``backward(v)``."""
    from graddoctor.instrument.customfn import _surrogate_off_step

    class Spike(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            ctx.save_for_backward(v)
            return (v > step_at).to(v.dtype)

        @staticmethod
        def backward(ctx, grad):
            v, = ctx.saved_tensors
            return grad * backward(v)

    def run(xs, grad):
        with torch.set_grad_enabled(grad):
            return [Spike.apply(xs[0])]

    base = [torch.linspace(-reach, reach, 7, dtype=torch.float64)]
    return _surrogate_off_step(run, base, 0)


def test_bumps_at_the_step_are_surrogates():
    assert _surrogate(lambda v: 1 / (10 * v.abs() + 1) ** 2) is None
    assert _surrogate(lambda v: (v.abs() < 0.5).to(v.dtype)) is None
    assert _surrogate(lambda v: torch.ones_like(v)) is None          # straight through
    assert _surrogate(lambda v: torch.exp(-(v - 1) ** 2), step_at=1.0) is None


def test_a_pole_a_bump_elsewhere_and_a_wrong_sign_are_told():
    pole = _surrogate(lambda v: 1 / (10 * v + 1) ** 2)
    assert pole is not None and abs(pole["peak"] + 0.1) < 0.01
    elsewhere = _surrogate(lambda v: torch.exp(-v ** 2 / 0.5), step_at=1.0)
    assert elsewhere is not None and abs(elsewhere["peak"]) < 0.01 and abs(elsewhere["step"] - 1) < 0.01
    assert _surrogate(lambda v: -1 / (v.abs() + 1))["wrong_sign"] is True


def test_the_rule_names_a_surrogate_at_the_backwards_return(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule

    script = tmp_path / "snn.py"
    script.write_text(
        "class Spike(torch.autograd.Function):\n"            # 1
        "    @staticmethod\n"                                # 2
        "    def backward(ctx, grad):\n"                     # 3
        "        v, = ctx.saved_tensors\n"                   # 4
        "        return grad / (10 * v + 1) ** 2\n"          # 5
        "loss.backward()\n")                                 # 6
    t = TraceBuilder(str(script))
    info = {"step": 0.0, "peak": -0.1, "at_step": 1.0, "largest": 3e5, "finite": True, "wrong_sign": False}
    t.put(ev.custom_backward(cls="Spike", input=0, ratio=None, forward=[str(script), 6], surrogate=info),
          3)
    f, = find_rule("custom-backward-wrong")().check(Analysis(t.trace))
    assert f.location.line == 5 and "-0.1" in f.message and "abs()" in f.fix
