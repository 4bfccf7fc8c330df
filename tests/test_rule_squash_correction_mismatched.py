"""squash-correction-mismatched (GD387): the statements analysis/squash_correction.py reads as a
tanh-squashed Gaussian's two halves taken at one value, which half it names, and the rule over a
hand-written trace."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.squash_correction import squash_corrections_mismatched
from rule_traces import builder, findings, only

SLUG = "squash-correction-mismatched"


def _read(tmp_path, text):
    path = tmp_path / "policy.py"
    path.write_text(dedent(text))
    return [(line, name, half) for line, _, name, half in squash_corrections_mismatched(str(path))]


@pytest.mark.parametrize("text, found", [
    # behaviour cloning of squashed actions: the Gaussian at the squashed data
    ("def f(dist, a):\n    return dist.log_prob(a).sum(-1) - torch.log(1 - a ** 2 + 1e-6).sum(-1)\n",
     [(2, "a", "gaussian")]),
    # the atanh forgotten behind an alias: the alias is the line to change
    ("u = a.clamp(-0.999, 0.999)\nlp = d.log_prob(u) - torch.log(1 - a.pow(2) + eps)\n",
     [(1, "a", "gaussian")]),
    # SAC with the Gaussian at the squashed action
    ("def s(n, eps):\n    x = n.rsample()\n    y = torch.tanh(x)\n    lp = n.log_prob(y)\n"
     "    lp -= torch.log(1 - y.pow(2) + eps)\n    return lp\n", [(4, "y", "gaussian")]),
    # SAC with the correction at the raw draw
    ("def s(n):\n    x = n.rsample()\n    return n.log_prob(x).sum(-1) - torch.log1p(-x * x).sum(-1)\n",
     [(3, "x", "correction")]),
    ("def s(n):\n    x = n.rsample()\n    lp = n.log_prob(x)\n    lp = lp - (1 - x.pow(2) + 1e-6).log()\n    return lp\n",
     [(4, "x", "correction")]),
])
def test_two_halves_at_one_value_are_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    # SAC right: the Gaussian at the draw, the correction at tanh of it
    "def s(n, eps):\n    x = n.rsample()\n    y = torch.tanh(x)\n    lp = n.log_prob(x)\n"
    "    lp -= torch.log(1 - y.pow(2) + eps)\n    return lp\n",
    # BC through atanh
    "u = torch.atanh(a)\nlp = d.log_prob(u) - torch.log(1 - a.pow(2) + 1e-6)\n",
    # Spinning Up's softplus form
    "lp = d.log_prob(u).sum(-1) - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)\n",
    # the two halves in different functions
    "def g(d, a):\n    return d.log_prob(a)\n\ndef c(a):\n    return torch.log(1 - a ** 2)\n",
    # a log(1 - p ** 2) of another value (a probability's complement)
    "lp = d.log_prob(a) + torch.log(1 - p ** 2)\n",
])
def test_correct_squashed_densities_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_names_the_half_at_the_wrong_point(tmp_path):
    path = tmp_path / "bc.py"
    path.write_text("lp = d.log_prob(a).sum(-1) - torch.log(1 - a.pow(2) + 1e-6).sum(-1)\nloss = -lp.mean()\n"
                    "loss.backward()\n")
    t = builder()
    t.path = str(path)
    t.backward(fresh=[0], line=3)
    t.step(line=4)
    f = only(t, SLUG)
    assert f.location.line == 1 and "atanh(a)" in f.fix and f.severity.value == "warning"
    other = tmp_path / "other.py"
    other.write_text(path.read_text())
    t = builder()
    t.path = str(tmp_path / "train.py")  # the backward ran in another file
    (tmp_path / "train.py").write_text("loss.backward()\n")
    t.backward(fresh=[0], line=1)
    assert findings(t, SLUG) == []
