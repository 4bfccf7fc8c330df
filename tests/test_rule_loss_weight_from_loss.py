"""loss-weight-from-loss (GD198): the graph reading (instrument/lossderived.py), the source's
weight and loss lines (analysis/source.py loss_sites), and the rule over hand-written traces."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.analysis.source import loss_sites
from graddoctor.findings import Severity
from graddoctor.instrument.lossderived import derived_weights
from rule_traces import builder, findings, only

SLUG = "loss-weight-from-loss"


def _losses():
    torch.manual_seed(0)
    lin, reg = torch.nn.Linear(4, 3), torch.nn.Linear(4, 1)
    x, y, t = torch.randn(8, 4), torch.randint(0, 3, (8,)), torch.randn(8, 1)
    return lin, x, y, F.cross_entropy(lin(x), y), F.mse_loss(reg(x), t)


def test_balancing_weights_and_a_focal_factor_of_a_batch_mean_are_found():
    lin, x, y, l1, l2 = _losses()
    total = l1 + l2
    assert derived_weights((l1 / total * l1 + l2 / total * l2).grad_fn) == ["ratio", "ratio"]
    stacked = torch.stack([l1, l2])
    assert derived_weights((torch.softmax(stacked, 0) * stacked).sum().grad_fn) == ["ratio"]
    ce = F.cross_entropy(lin(x), y)
    assert derived_weights((0.25 * (1 - torch.exp(-ce)) ** 2 * ce).grad_fn) == ["self"]


def test_detached_learned_per_sample_and_ratio_objectives_are_not():
    lin, x, y, l1, l2 = _losses()
    total = l1 + l2
    assert derived_weights(((l1 / total).detach() * l1 + (l2 / total).detach() * l2).grad_fn) == []
    s = torch.zeros(2, requires_grad=True)
    assert derived_weights((torch.exp(-s[0]) * l1 + s[0] + torch.exp(-s[1]) * l2 + s[1]).grad_fn) == []
    ce = F.cross_entropy(lin(x), y, reduction="none")
    assert derived_weights(((1 - torch.exp(-ce)) ** 2 * ce).mean().grad_fn) == []
    assert derived_weights((l1 / l2).grad_fn) == []  # a ratio of two terms is the objective
    assert derived_weights((l1 * l2).grad_fn) == []
    assert derived_weights((l2 / l2.detach()).grad_fn) == []


def test_loss_sites_names_the_weight_line_and_the_loss_lines(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""\
        l_cls = F.cross_entropy(logits / T, y)
        l_reg = criterion(pred, t)
        total = l_cls + l_reg
        w_ok = (l_cls / total).detach()
        w_cls, w_reg = l_cls / total, l_reg / total
        losses = torch.stack([F.mse_loss(a, b), F.l1_loss(c, d)])
        weights = torch.softmax(losses, 0)
        """))
    losses, weights = loss_sites(str(path))
    assert losses == {"l_cls": 1, "l_reg": 2, "total": 3, "losses": 6}
    assert [(line, names) for line, names, _ in weights] == [(5, ["l_cls", "l_reg", "total"]),
                                                            (7, ["losses"])]


def _trace(kinds):
    t = builder(params=[0, 1])
    for i in range(3):
        t.clear([0, 1], line=20)
        if kinds:
            t.put(ev.loss_derived_weight(kinds=list(kinds), terms=2), 21)
        t.backward(fresh=[0, 1], line=21)
        t.step(line=22)
    return t


def test_the_rule_reports_a_warning_per_event_and_nothing_without_one():
    f = only(_trace(["ratio"]), SLUG)
    assert f.severity is Severity.WARNING
    assert "keeps their graph" in f.message or "graph" in f.message
    g = only(_trace(["self"]), SLUG)
    assert "one number for the whole batch" in g.message and "reduction" in g.fix
    assert findings(_trace(()), SLUG) == []


def test_a_term_divided_by_its_own_size_with_the_divisor_attached_is_found():
    torch.manual_seed(0)
    q = torch.nn.Linear(4, 1)(torch.randn(8, 4))
    bc = torch.randn(8, 1, requires_grad=True).pow(2).mean()
    assert derived_weights((-(2.5 / q.abs().mean()) * q.mean() + bc).grad_fn) == ["scale"]  # TD3+BC
    assert derived_weights((-2.5 * q.mean() / (q.abs().mean() + 1e-6)).grad_fn) == ["scale"]
    assert derived_weights((q.mean() / q.norm()).grad_fn) == ["scale"]
    assert derived_weights((q.sum() * (1.0 / q.pow(2).mean().sqrt())).grad_fn) == ["scale"]


def test_a_detached_normaliser_a_sharpe_ratio_or_another_tensors_size_is_not():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 1)
    q, other = lin(torch.randn(8, 4)), lin(torch.randn(8, 4))
    assert derived_weights((-(2.5 / q.abs().mean().detach()) * q.mean()).grad_fn) == []
    assert derived_weights((-q.mean() / q.std()).grad_fn) == []  # a Sharpe ratio
    assert derived_weights((-(2.5 / other.abs().mean()) * q.mean()).grad_fn) == []
    assert derived_weights((q.mean() / q.pow(2).mean()).grad_fn) == []  # not of degree 1


def test_the_divisors_assignment_is_found_in_the_source(tmp_path):
    from graddoctor.analysis.self_normalised import self_normalising_line
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""\
        def update(s, a):
            pi = actor(s)
            q = critic(s, pi)
            keep = alpha / q.abs().mean().detach()
            lmbda = alpha / q.abs().mean()
            loss = -lmbda * q.mean() + F.mse_loss(pi, a)
            loss.backward()
        """))
    assert self_normalising_line(str(path), 7) == (5, "lmbda = alpha / q.abs().mean()", "q")
    path.write_text("lam = alpha / q.abs().mean().item()\nloss = -lam * q.mean()\nloss.backward()\n")
    assert self_normalising_line(str(path), 3) is None


def test_the_rule_points_at_the_divisor_and_says_to_detach_it(tmp_path):
    path = tmp_path / "td3bc.py"
    path.write_text("lmbda = 2.5 / q.abs().mean()\nloss = -lmbda * q.mean() + bc\nloss.backward()\n")
    t = builder(params=[0, 1])
    t.path = str(path)
    t.put(ev.loss_derived_weight(kinds=["scale"], terms=1), 3)
    t.backward(fresh=[0, 1], line=3)
    t.step(line=4)
    f = only(t, SLUG)
    assert f.location.line == 1 and "`q`" in f.message and "detach" in f.fix
