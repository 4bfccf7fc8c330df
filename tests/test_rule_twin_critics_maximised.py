"""twin-critics-maximised (GD293): the statements analysis/source.py's twin_critics_maximised
reads as a discounted target taking the larger of twin critics, and the rule's fix."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.source import twin_critics_maximised


def _read(tmp_path, text):
    path = tmp_path / "rl.py"
    path.write_text(dedent(text))
    return [(line, maximum) for line, _, maximum in twin_critics_maximised(str(path))]


@pytest.mark.parametrize("text, found", [
    ("y = r + gamma * torch.max(q1_t(s2), q2_t(s2))\n", [(1, "torch.max(q1_t(s2), q2_t(s2))")]),
    ("m = torch.maximum(qf1_next, qf2_next) - alpha * logp\ny = r + gamma * m\n",
     [(1, "torch.maximum(qf1_next, qf2_next)")]),
    ("y = r + discount * torch.stack([qs[0], qs[1]]).max(0).values\n",
     [(1, "torch.stack([qs[0], qs[1]]).max(0)")]),
    ("y = r + self.gamma * torch.max(torch.cat([critic1(x), critic2(x)], 1), dim=1)[0]\n",
     [(1, "torch.max(torch.cat([critic1(x), critic2(x)], 1), dim=1)")]),
])
def test_a_discounted_maximum_of_twin_critics_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "y = r + gamma * torch.min(q1_t(s2), q2_t(s2))\n",
    "y = r + gamma * torch.stack([q1, q2]).min(0).values\n",
    "y = r + gamma * q(s2).max(1).values\n",  # a max over actions of one critic
    "upper = torch.max(q1(sa), q2(sa))\nprint(upper.mean())\n",  # logged, not discounted
    "y = r + gamma * torch.max(q, baseline)\n",  # not twins
    "y = r + gamma * torch.max(x1, x2)\n",  # twins, but no critic named
])
def test_minima_single_critics_and_undiscounted_maxima_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_fix_names_the_minimum_of_the_same_twins(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "td3.py"
    script.write_text("target_Q = reward + discount * torch.max(target_Q1, target_Q2)\n")
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    b.backward(fresh=[0], line=1)
    (found,) = find_rule("twin-critics-maximised")().check(Analysis(b.trace))
    assert found.location.line == 1 and "torch.min(target_Q1, target_Q2)" in found.fix
