"""loss-term-constant (GD373): what instrument/constantterm.py decides about a loss's terms,
and the rule over a hand-written event."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.constantterm import _origin, constant, judge, linear_top
from graddoctor.trace import TraceBuilder
from rule_traces import findings


def _logits():
    torch.manual_seed(0)
    w = torch.randn(6, 4, requires_grad=True)
    return torch.randn(8, 6) @ w  # (8, 4): an activation with a gradient


def test_constant_needs_still_values_and_a_moving_loss():
    assert constant([1.0, 1.0000001, 0.9999999, 1.0], [2.3, 2.1, 1.9, 1.7])
    assert constant([1e-15, 0.0, 3e-16, 2e-15], [2.3, 2.1, 1.9, 1.7])  # all zero against the loss
    assert not constant([1.0, 1.01, 0.99, 1.0], [2.3, 2.1, 1.9, 1.7])  # the term moves
    assert not constant([1.0, 1.0, 1.0, 1.0], [2.3, 2.3, 2.3, 2.3])  # the loss did not move either


def test_a_softmax_summed_over_its_own_axis_is_an_activations_constant():
    logits = _logits()
    p = logits.softmax(dim=1)
    term = ((p.sum(dim=1) - 1) ** 2).mean()
    loss = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long)) + term
    assert term.grad_fn in linear_top(loss.grad_fn)
    assert judge(loss.grad_fn, term.grad_fn) is not None


def test_a_hinge_a_zero_factor_and_a_parameter_penalty_are_not():
    logits = _logits()
    ce = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
    hinge = F.relu(logits.abs().amax(dim=1) - 30.0).mean()  # inactive for now
    assert judge((ce + hinge).grad_fn, hinge.grad_fn) is None
    keep = 0.0 * logits.sum()
    assert judge((ce + keep).grad_fn, keep.grad_fn) is None
    w = torch.randn(4, 4, requires_grad=True)
    penalty = ((w @ w.t() - torch.eye(4)) ** 2).sum()  # the parameters alone: no activation shared
    assert judge((ce + penalty).grad_fn, penalty.grad_fn) is None


def test_the_origin_is_the_constant_farthest_below_the_term():
    logits = _logits()
    p = logits.softmax(dim=1)
    usage = p.sum(dim=1) / 8  # (8,): 1/8 everywhere
    balance = (usage * torch.log(usage * 4)).sum()
    loss = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long)) + balance
    own = judge(loss.grad_fn, balance.grad_fn)
    assert own is not None
    assert _origin(balance.grad_fn, own, {"usage": usage}) == "usage"
    assert _origin(balance.grad_fn, own, {"logits": logits}) is None  # shared with the rest: not its own


def _findings(origin, params=(0, 1)):
    script = textwrap.dedent("""\
        for step in range(3):
            usage = p.sum(dim=1) / p.size(0)
            balance = (usage * torch.log(usage * K)).sum()
            loss = ce + 0.5 * balance
            loss.backward()
        """)
    path = Path(tempfile.mkdtemp()) / "train.py"
    path.write_text(script)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.constant_term(name="balance", value=0.0, loss_low=1.2, loss_high=1.6,
                           params=list(params), origin=origin), line=5)
    return findings(t, "loss-term-constant")


def test_the_rule_points_at_the_origin_else_at_the_term():
    at_origin, = _findings("usage")
    assert at_origin.location.line == 2 and "usage" in at_origin.message
    at_term, = _findings(None)
    assert at_term.location.line == 3
    assert _findings("usage", params=(7,)) == []  # nothing an optimizer steps


def test_a_zero_term_beside_a_self_comparison_is_left_to_loss_compares_with_itself():
    t = TraceBuilder("train.py")
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.same_compared(how="twins", op="difference", core="MeanBackward1", shape=None,
                           params=[0, 1], starts=[]), line=5)
    t.put(ev.constant_term(name="align", value=0.0, loss_low=1.2, loss_high=1.6, params=[0, 1]), line=5)
    assert findings(t, "loss-term-constant") == []


def test_a_mask_product_and_a_ratio_to_its_own_detached_copy_are_not():
    logits = _logits()
    ce = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long), reduction="none")
    masked = (ce * torch.zeros(8)).mean()  # a confidence mask that keeps nothing yet
    assert judge((ce.mean() + masked).grad_fn, masked.grad_fn) is None
    ratio = ce.mean() / ce.mean().detach()  # 1 by construction, with a gradient
    assert judge((ce.mean() + ratio).grad_fn, ratio.grad_fn) is None
