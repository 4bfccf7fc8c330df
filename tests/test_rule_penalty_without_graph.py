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
