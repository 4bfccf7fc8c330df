"""langevin-drift-of-batch-mean (GD370): the source search for Langevin loops whose drift is
the gradient of a batch mean, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.langevin_drift_of_batch_mean import mean_drifts
from graddoctor.trace import TraceBuilder

SLUG = "langevin-drift-of-batch-mean"


def _found(src: str):
    return mean_drifts(ast.parse(src))


def test_the_gradient_of_a_batch_mean_with_noise_is_found():
    inline = ("for _ in range(5):\n"
              "    g = torch.autograd.grad(energy(x).mean(), x)[0]\n"
              "    x = x - 0.5 * eps * g + eps ** 0.5 * torch.randn_like(x)\n")
    assert _found(inline) == [(2, "x", "energy(x).mean()", 3)]
    named = ("while k < 5:\n"
             "    e = torch.mean(f(x))\n"
             "    g, = torch.autograd.grad(e, [x])\n"
             "    noise = torch.randn_like(x)\n"
             "    x = x + step * -g + noise\n")
    assert _found(named) == [(2, "x", "torch.mean(f(x))", 5)]


def test_right_loops_stay_silent():
    for src in (
        "for _ in range(5):\n    g = torch.autograd.grad(energy(x).sum(), x)[0]\n"
        "    x = x - eps * g + torch.randn_like(x)\n",                                   # the sum
        "for _ in range(5):\n    g = torch.autograd.grad(energy(x).mean(), x)[0]\n"
        "    x = x - eps * g\n",                                                          # no noise
        "for _ in range(5):\n    g = torch.autograd.grad(loss(x).mean(), x)[0]\n"
        "    x = x + a * g.sign() + torch.randn_like(x)\n",                               # its sign
        "for _ in range(5):\n    g = torch.autograd.grad(energy(x).mean(1), x)[0]\n"
        "    x = x - eps * g + torch.randn_like(x)\n",                                    # one axis
        "for _ in range(5):\n    g = torch.autograd.grad(energy(x).mean(), w)[0]\n"
        "    x = x - eps * g + torch.randn_like(x)\n",                                    # not x's
        "for _ in range(5):\n    g = torch.autograd.grad(energy(x).mean(), x)[0]\n"
        "    y = x - eps * g + torch.randn_like(x)\n",                                    # x not moved
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_mean(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("for _ in range(5):\n"
                      "    e = energy(x).mean()\n"
                      "    g = torch.autograd.grad(e, x)[0]\n"
                      "    x = x - eps * g + torch.randn_like(x)\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=5)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert found[0].severity is Severity.WARNING
    assert "energy(x).sum()" in found[0].fix
