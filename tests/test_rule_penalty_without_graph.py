"""penalty-without-graph (GD237): hand-written traces over small scripts on disk (the rule
follows the autograd.grad result through the source to the backpropagated loss)."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "penalty-without-graph"

PENALTY = """\
import torch
for x, y in data:
    x.requires_grad_(True)
    out = model(x)
    g, = torch.autograd.grad(out.sum(), x, retain_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = crit(out, y) + 10 * penalty
    loss.backward()
"""

FGSM = """\
import torch
for x, y in data:
    x.requires_grad_(True)
    g, = torch.autograd.grad(crit(model(x), y), x)
    x_adv = (x + 0.1 * g.sign()).detach()
    loss = crit(model(x_adv), y)
    loss.backward()
"""

HELPER = """\
import torch
def gradient_penalty(d, real):
    real.requires_grad_(True)
    g = torch.autograd.grad(outputs=d(real).sum(), inputs=real)[0]
    return g.pow(2).sum(1).mean()
for real in data:
    gp = gradient_penalty(D, real)
    loss = D(real).mean() + gp
    loss.backward()
"""


def traced(tmp_path, text, grad_line, create_graph=False):
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    for _ in range(2):
        t.put(ev.functional_grad(api="torch.autograd.grad", create_graph=create_graph), grad_line)
        t.backward(fresh=[0], line=8)
        t.step(0, line=8)
    return t


def test_a_penalty_without_create_graph_is_a_warning_at_the_grad_call(tmp_path):
    f = only(traced(tmp_path, PENALTY, 5), SLUG)
    assert f.location.line == 5 and "line 8" in f.message


def test_create_graph_true_is_silent(tmp_path):
    assert findings(traced(tmp_path, PENALTY, 5, create_graph=True), SLUG) == []


def test_fgsm_is_silent(tmp_path):
    assert findings(traced(tmp_path, FGSM, 4), SLUG) == []


def test_a_helper_that_returns_the_penalty_is_followed(tmp_path):
    f = only(traced(tmp_path, HELPER, 4), SLUG)
    assert "line 9" in f.message


# -- a penalty on the parameters computed from values cut from the graph ------------------------

CUT = """\
import torch
for x, y in data:
    out = model(x)
    l2 = sum((p.data ** 2).sum() for p in model.parameters())
    loss = crit(out, y) + 1e-2 * l2
    loss.backward()
"""

LOGGED = """\
import torch
for x, y in data:
    out = model(x)
    logged = sum(p.detach().pow(2).sum() for p in model.parameters())
    loss = 0
    loss += crit(out.detach(), y)
    loss.backward()
"""


def constant_loss(tmp_path, text, flags, line=6):
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    for flag in flags:
        t.backward(fresh=[0], line=line, loss_constant=flag or None)
        t.step(0, line=line)
    return t


def test_a_loss_that_adds_a_penalty_on_cut_parameters_is_a_warning_at_the_penalty(tmp_path):
    f = only(constant_loss(tmp_path, CUT, [True] * 4), SLUG)
    assert f.location.line == 4 and f.evidence["via"] == "cut" and f.evidence["backwards"] == 4
    # the checks stop after the first backwards: later ones carry no mark
    assert only(constant_loss(tmp_path, CUT, [True] * 3 + [False] * 5), SLUG)


def test_silent_unless_every_checked_loss_adds_a_term_without_graph(tmp_path):
    assert findings(constant_loss(tmp_path, CUT, [True, False, True, True]), SLUG) == []
    assert findings(constant_loss(tmp_path, CUT, [False] * 4), SLUG) == []
    assert findings(constant_loss(tmp_path, CUT, [True]), SLUG) == []  # one backward
    # a term without graph the source does not show cut from the parameters (a sum from 0)
    assert findings(constant_loss(tmp_path, LOGGED, [True] * 4, line=7), SLUG) == []


def test_the_loss_walk_finds_a_term_without_graph_at_the_top_sum():
    import torch

    from graddoctor.instrument.lossfactor import constant_term

    w = torch.nn.Parameter(torch.ones(3))
    loss = (w * 2).sum()
    assert constant_term(loss + 0.1 * (w.data ** 2).sum())
    assert constant_term((loss + w.detach().sum()) / 2)
    assert not constant_term(loss + 0.1 * (w ** 2).sum())
    assert constant_term(loss + 1.0)  # a Python number looks the same: the source tells them apart
    assert not constant_term(sum([loss, loss * 2]))  # sum() from 0: the 0 is at the bottom
    assert not constant_term(loss)
