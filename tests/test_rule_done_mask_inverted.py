"""done-mask-inverted (GD292): the statements analysis/source.py's done_flag_bootstraps reads as
a bootstrapped value kept only where the episode ended, and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.source import done_flag_bootstraps


def _read(tmp_path, text):
    path = tmp_path / "rl.py"
    path.write_text(dedent(text))
    return [(line, name, form) for line, _, name, form in done_flag_bootstraps(str(path))]


@pytest.mark.parametrize("text, found", [
    ("nextnonterminal = dones[t + 1]\n", [(1, "dones", "mask")]),
    ("not_done = b_terminals.float()\n", [(1, "b_terminals", "mask")]),
    ("y = r + gamma * q_next * done\n", [(1, "done", "factor")]),
    ("y = r + self.gamma * q_next.max(1)[0] * batch.dones.unsqueeze(1)\n", [(1, "dones", "factor")]),
    ("ret = rew[t] + GAMMA * ret * terminated[t]\n", [(1, "terminated", "factor")]),
])
def test_a_done_flag_taken_as_the_continuation_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "nextnonterminal = 1.0 - dones[t + 1]\n",
    "y = r + gamma * q_next * (1 - done)\n",
    "y = r + gamma * q_next * done_mask\n",  # minimalRL's mask (0.0 if done else 1.0)
    "y = r + gamma * q_next * masks[t]\n",
    "y = r + gamma * q_next * not_done\n",
    "y = r + gamma * q_next * (~done).float()\n",
    "dones = 1 - terminated\ny = r + gamma * q_next * dones\n",  # stored as a complement
    "done = 0.0 if finished else 1.0\ny = r + gamma * v * done\n",
    "episode_return = reward * done\n",  # no discount in the product
    "ret = reward + gamma * terminal_value\n",  # a value at the end, no flag
    "y = r + gamma * q_next\nif done: state = env.reset()\n",
])
def test_masks_complements_and_other_uses_of_a_flag_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "rl.py"
    script.write_text("nextnonterminal = dones[t + 1]\n")
    rule = find_rule("done-mask-inverted")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=1)
    found = list(rule.check(Analysis(b.trace)))
    assert [(f.location.line, f.evidence["form"]) for f in found] == [(1, "mask")]
    assert "1.0 - dones[t + 1]" in found[0].fix
