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
