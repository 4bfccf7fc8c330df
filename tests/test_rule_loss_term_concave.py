"""loss-term-concave (GD272): the watcher's checks of where/minimum/products
(instrument/concave.py) and the rule over hand-written traces."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.instrument import concave
from rule_traces import builder, findings, only

SLUG = "loss-term-concave"


class _Loc:
    path, line = "train.py", 7


class _Rec:
    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc=None):
        self.emitted.append(made)


def _watched(compute):
    """The watcher's verdict for the loss ``compute()`` makes, its calls fed by hand."""
    w = concave.ConcaveTermWatcher(_Rec())
    w._caller = lambda: _Loc()
    loss, calls = compute()
    for form, args, result in calls:
        if form == "weights":
            w._product(args, {}, result)
        else:
            w._selected(form, form)(args, {}, result)
    w.describe_loss(loss)
    return [data["form"] for kind, data in w.rec.emitted]


torch.manual_seed(0)
PRED = torch.randn(32, 1, requires_grad=True)
Y = torch.randn(32, 1)
Q = 0.8


def _where(swapped, sign=1.0):
    def compute():
        e = Y - PRED
        a, b = (Q - 1) * e, Q * e
        if not swapped:
            a, b = b, a
        out = torch.where(e >= 0, a, b)
        return sign * out.mean(), [("where", (e >= 0, a, b), out)]
    return compute


def test_a_where_that_takes_the_negative_side_and_is_minimised_is_found():
    assert _watched(_where(swapped=True)) == ["where"]
    assert _watched(_where(swapped=False)) == []
    assert _watched(_where(swapped=True, sign=-1.0)) == []  # maximised: convex once negated


def test_a_minimum_of_two_opposite_lines_and_swapped_weights_are_found():
    def minimum():
        e = Y - PRED
        a, b = Q * e, (Q - 1) * e
        out = torch.minimum(a, b)
        return out.mean(), [("min", (a, b), out)]

    def weights(swapped):
        def compute():
            e = Y - PRED
            w = Q - ((e >= 0) if swapped else (e < 0)).float()
            out = e * w
            return out.mean(), [("weights", (e, w), out)]
        return compute
    assert _watched(minimum) == ["min"]
    assert _watched(weights(True)) == ["weights"]
    assert _watched(weights(False)) == []

    def far(swapped):  # every residual positive: the weights hold q - 1 (swapped) or q only
        def compute():
            e = Y.abs() + 5 - PRED.detach().abs() * 0 - PRED * 0.01
            w = Q - ((e >= 0) if swapped else (e < 0)).float()
            out = e * w
            return out.mean(), [("weights", (e, w), out)]
        return compute
    assert _watched(far(True)) == ["weights"]
    assert _watched(far(False)) == []


def test_one_signed_branches_and_mixed_products_are_not():
    def huber():
        e = Y - PRED
        a, b = 0.5 * e ** 2, e.abs() - 0.5
        out = torch.where(e.abs() < 1, a, b)
        return out.mean(), [("where", (e.abs() < 1, a, b), out)]

    def reinforce():
        logp = torch.log_softmax(PRED.expand(32, 2), 1)[:, 0]
        adv = torch.randn(32)
        out = logp * adv
        return -out.mean(), [("weights", (logp, adv), out)]
    assert _watched(huber) == []
    assert _watched(reinforce) == []


def _trace(backwards):
    t = builder(params=[0, 1])
    for _ in range(backwards):
        t.clear([0, 1], line=10)
        t.put(ev.concave_term(form="where", negative=1.0, line=7), line=7)
        t.backward(fresh=[0, 1], line=11)
        t.step(0, line=12)
    return t


def test_the_rule_warns_at_two_backwards_at_the_calls_line():
    f = only(_trace(2), SLUG)
    assert f.location.line == 7 and f.evidence == {"form": "where", "negative": 1.0, "backwards": 2}


def test_the_rule_is_silent_after_one_backward():
    assert findings(_trace(1), SLUG) == []
