"""loss-term-trains-nothing (GD294): the additive terms of instrument/deadterm.py, the term's
name in the loss's assignment, and the rule over hand-written traces (a GAN generator step
whose adversarial term reaches only the discriminator)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.deadterm import additive_terms
from graddoctor.rules.loss_term_trains_nothing import _function, _term_name
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "loss-term-trains-nothing"

torch.manual_seed(0)
G, D = nn.Linear(4, 4), nn.Linear(4, 1)
Z, REAL = torch.randn(8, 4), torch.randn(8, 4)


def _leaves(node):
    out, stack, seen = set(), [node], set()
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        if getattr(n, "variable", None) is not None:
            out.add(id(n.variable))
        stack.extend(c for c, _ in n.next_functions)
    return out


def test_the_terms_of_a_weighted_sum_are_split_in_the_operands_order():
    fake = G(Z)
    pred = D(fake.detach())
    loss = F.mse_loss(pred, torch.ones_like(pred)) + 100 * F.l1_loss(fake, REAL)
    terms = additive_terms(loss.grad_fn)
    assert [(path, type(node).__name__) for path, node in terms] == [
        ((0,), "MseLossBackward0"), ((1,), "AbsBackward0")]  # l1_loss: |x - y|.mean()
    assert _leaves(terms[0][1]) == {id(D.weight), id(D.bias)}
    assert _leaves(terms[1][1]) == {id(G.weight), id(G.bias)}


def test_negations_means_and_constant_factors_are_walked_through():
    pi = G(Z)
    q = D(pi.detach())
    loss = -q.mean() + 1e-3 * (pi ** 2).mean()
    names = [(path, type(node).__name__) for path, node in additive_terms(loss.grad_fn)]
    assert names == [((0,), "AddmmBackward0"), ((1,), "PowBackward0")]


def test_a_product_of_two_computed_tensors_is_one_term():
    a, b = G(Z).sum(), D(REAL).sum()
    assert len(additive_terms((a * b).grad_fn)) == 1


def test_the_terms_name_follows_the_additions():
    assert _term_name("loss_G = loss_G_GAN + loss_G_L1", [0]) == "loss_G_GAN"
    assert _term_name("loss_G = loss_G_GAN + loss_G_L1", [1]) == "loss_G_L1"
    assert _term_name("loss = a + 0.5 * (b - c)", [1, 1]) == "c"
    assert _term_name("policy_loss = -q.mean() + 1e-3 * (pi ** 2).mean()", [0]) == "q"
    assert _term_name("policy_loss = -q.mean() + 1e-3 * (pi ** 2).mean()", [1]) is None
    assert _function("MseLossBackward0") == "mse_loss"
    assert _function("BinaryCrossEntropyWithLogitsBackward0") == "binary_cross_entropy_with_logits"


def _gan(turns=3, one_optimizer=False, dead=True):
    t = builder(params=[0, 1, 2, 3] if one_optimizer else [0, 1])
    if not one_optimizer:
        t.optimizer(1, [2, 3], line=2)
    for _ in range(turns):
        t.clear([2, 3], opt=0 if one_optimizer else 1, line=20)
        t.backward(fresh=[2, 3], line=21)
        t.step(0 if one_optimizer else 1, line=22)
        t.clear([0, 1], opt=0, line=24)
        adv = [2, 3] if dead else [0, 1, 2, 3]
        t.put(ev.loss_term_params(terms=[{"path": [0], "op": "MseLossBackward0", "params": adv},
                                         {"path": [1], "op": "L1LossBackward0", "params": [0, 1]}],
                                  line=25), line=25)
        t.backward(fresh=[0, 1], accumulated=[2, 3], line=25)
        t.step(0, line=26)
    return t


def test_a_term_reaching_only_the_other_optimizers_cleared_parameters_is_reported():
    f = only(_gan(), SLUG)
    assert f.location.line == 25
    assert f.evidence["op"] == "MseLossBackward0" and f.evidence["params"] == [2, 3]
    assert "zero_grad at line 20" in f.message


def test_a_term_whose_parameters_a_step_applies_is_silent():
    assert findings(_gan(one_optimizer=True), SLUG) == []  # one optimizer steps D's part too
    assert findings(_gan(dead=False), SLUG) == []  # the term reaches G through D


def test_one_backward_is_not_enough():
    assert findings(_gan(turns=1), SLUG) == []


def test_a_backward_that_trains_nothing_at_all_is_left_to_other_rules():
    t = builder(params=[0, 1])
    t.optimizer(1, [2, 3], line=2)
    for _ in range(3):
        t.clear([2, 3], opt=1, line=20)
        t.put(ev.loss_term_params(terms=[{"path": [0], "op": "MseLossBackward0", "params": [2]},
                                         {"path": [1], "op": "MseLossBackward0", "params": [3]}],
                                  line=25), line=25)
        t.backward(fresh=[2, 3], line=25)
        t.step(0, line=26)
    assert findings(t, SLUG) == []


def test_accumulated_backwards_applied_by_a_later_step_are_silent():
    t = builder(params=[0, 1, 2])
    for _ in range(2):
        for _micro in range(2):
            t.put(ev.loss_term_params(terms=[{"path": [0], "op": "MseLossBackward0", "params": [0, 1]},
                                             {"path": [1], "op": "NllLossBackward0", "params": [2]}],
                                      line=25), line=25)
            t.backward(accumulated=[0, 1, 2], line=25)
        t.step(0, line=26)
        t.clear([0, 1, 2], opt=0, line=27)
    assert findings(t, SLUG) == []


def test_gradients_still_pending_when_the_run_ends_are_not_called_dead():
    t = builder(params=[0, 1])
    t.optimizer(1, [2, 3], line=2)
    for _ in range(3):
        t.put(ev.loss_term_params(terms=[{"path": [0], "op": "MseLossBackward0", "params": [2, 3]},
                                         {"path": [1], "op": "L1LossBackward0", "params": [0, 1]}],
                                  line=25), line=25)
        t.backward(accumulated=[0, 1, 2, 3], line=25)
        t.step(0, line=26)
    # opt 1 (a critic stepped every few turns, say) has not stepped or cleared yet
    assert findings(t, SLUG) == []


def test_a_cut_that_sample_not_reparameterised_tells_is_left_to_it():
    t = _gan()
    t.put(ev.reparam_cut(dist="Normal", params=[0, 1], op="AddmmBackward0", via="sample", backward=25), line=24)
    assert findings(t, SLUG) == []


def test_terms_that_share_parameters_on_both_sides_still_fall_into_two_groups():
    from graddoctor.instrument.deadterm import _groups
    # a generator's two spectral terms share G, its adversarial and feature-matching terms D
    assert sorted(map(sorted, _groups([{0, 1}, {0, 1}, {2, 3}, {2}]))) == [[0, 1], [2, 3]]
    assert len(_groups([{0, 1}, {1, 2}, {2, 3}])) == 1  # chained through shared parameters
    assert len(_groups([{0, 1, 2, 3}, {0, 1}, {2, 3}])) == 1  # a correct generator step


def test_the_first_dead_term_in_the_operands_order_is_reported():
    t = builder(params=[0, 1])
    t.optimizer(1, [2, 3], line=2)
    for _ in range(3):
        t.clear([2, 3], opt=1, line=20)
        t.backward(fresh=[2, 3], line=21)
        t.step(1, line=22)
        t.clear([0, 1], opt=0, line=24)
        t.put(ev.loss_term_params(terms=[
            {"path": [0, 0], "op": "L1LossBackward0", "params": [0, 1]},
            {"path": [0, 1, 0], "op": "MseLossBackward0", "params": [0, 1]},
            {"path": [1, 0], "op": "AddBackward0", "params": [2]},
            {"path": [0, 1, 1], "op": "PowBackward0", "params": [2, 3]}], line=25), line=25)
        t.backward(fresh=[0, 1], accumulated=[2, 3], line=25)
        t.step(0, line=26)
    f = only(t, SLUG)
    assert f.evidence["op"] == "PowBackward0"


def test_a_hand_written_term_is_followed_back_to_its_cut(tmp_path):
    from graddoctor.analysis.source import graph_cut
    script = tmp_path / "gan.py"
    script.write_text(
        "fake = G(z)\n"
        "d_fake, feats = D(fake.detach())\n"
        "g_adv = ((d_fake - 1) ** 2).mean()\n"
        "loss_g = g_adv + l1\n")
    assert graph_cut(str(script), 3, "pow") is None  # no loss call on the line
    line, text, how = graph_cut(str(script), 3, "pow", whole=True)
    assert (line, how) == (2, ".detach()")


HELPER_GAN = (
    "def g_loss(out):\n"                              # 1
    "    return ((out - 1) ** 2).mean()\n"            # 2
    "\n"                                              # 3
    "for step in range(3):\n"                         # 4
    "    opt_d.zero_grad()\n"                         # 5
    "    d_loss = d_crit(D(real), D(fake.detach()))\n"  # 6
    "    d_loss.backward()\n"                         # 7
    "    opt_d.step()\n"                              # 8
    "    opt_g.zero_grad()\n"                         # 9
    "    d_out, feats = D(fake.detach())\n"           # 10
    "    loss_g = 45 * l1(fake, real) + 2 * g_loss(d_out)\n"  # 11
    "    loss_g.backward()\n"                         # 12
    "    opt_g.step()\n")                             # 13


def test_a_term_that_is_a_helpers_call_is_followed_back_to_its_cut(tmp_path):
    from graddoctor.analysis.source import operand_cut, sum_operand_text
    script = tmp_path / "gan.py"
    script.write_text(HELPER_GAN)
    # the trace's path runs on inside the helper's own sum: the call holds the term
    assert operand_cut(str(script), 11, (1, 0, 0)) == (10, "d_out, feats = D(fake.detach())", ".detach()")
    assert sum_operand_text(str(script), 11, (1, 0)) == "g_loss(d_out)"
    assert operand_cut(str(script), 11, (0,)) is None  # the L1 term: nothing cut behind it
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.optimizer(1, [2, 3], line=2)
    for _ in range(3):
        t.clear([2, 3], opt=1, line=5)
        t.backward(fresh=[2, 3], line=7)
        t.step(1, line=8)
        t.clear([0, 1], opt=0, line=9)
        t.put(ev.loss_term_params(terms=[{"path": [0], "op": "AbsBackward0", "params": [0, 1]},
                                         {"path": [1, 0], "op": "PowBackward0", "params": [2, 3]}],
                                  line=12), line=12)
        t.backward(fresh=[0, 1], accumulated=[2, 3], line=12)
        t.step(0, line=13)
    f = only(t, SLUG)
    assert f.location.line == 10
    assert "`g_loss(d_out)`" in f.message and "cut at `d_out, feats = D(fake.detach())`" in f.message


def test_a_helpers_call_with_no_cut_behind_it_stays_at_the_assignment(tmp_path):
    script = tmp_path / "gan.py"
    script.write_text(HELPER_GAN.replace("d_out, feats = D(fake.detach())", "d_out, feats = D(fake)"))
    t = TraceBuilder(str(script))
    t.optimizer(0, [0, 1], line=1)
    t.optimizer(1, [2, 3], line=2)
    for _ in range(3):
        t.clear([2, 3], opt=1, line=5)
        t.backward(fresh=[2, 3], line=7)
        t.step(1, line=8)
        t.clear([0, 1], opt=0, line=9)
        t.put(ev.loss_term_params(terms=[{"path": [0], "op": "AbsBackward0", "params": [0, 1]},
                                         {"path": [1, 0], "op": "PowBackward0", "params": [2, 3]}],
                                  line=12), line=12)
        t.backward(fresh=[0, 1], accumulated=[2, 3], line=12)
        t.step(0, line=13)
    f = only(t, SLUG)  # the values say the term is dead; the text shows no cut: its assignment
    assert f.location.line == 11 and "`g_loss(d_out)`" in f.message
