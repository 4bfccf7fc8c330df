"""greedy-q-trained (GD300): the assignments analysis/greedy_q.py reads as a Q-learning
prediction taken as the maximum over the actions, and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.greedy_q import greedy_q_predictions


def _read(tmp_path, text):
    path = tmp_path / "q.py"
    path.write_text(dedent(text))
    return [(line, q, loss_line) for line, _, q, loss_line in greedy_q_predictions(str(path))]


@pytest.mark.parametrize("text, found", [
    ("q = agent(obs)\nchosen = q.max(dim=2)[0]\nq_tot = mixer(chosen, s)\nloss = F.mse_loss(q_tot, y)\n",
     [(2, "q", 4)]),
    ("pred = q_values.max(1)[0]\ntd = pred - target\n", [(1, "q_values", 2)]),
    ("cur = torch.max(q_values, 1)[0]\nl = F.smooth_l1_loss(cur, y)\n", [(1, "q_values", 2)]),
    ("def learn(self, s, y):\n    qs = self.net(s)\n    p = qs.max(-1).values\n    return F.mse_loss(p, y)\n",
     [(3, "qs", 4)]),
])
def test_a_max_over_the_actions_reaching_the_loss_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "with torch.no_grad():\n    q_next = q(s2)\n    m = q_next.max(1)[0]\nloss = F.mse_loss(p, r + m)\n",
    "next_q = q_net(s2).max(1)[0]\nloss = F.mse_loss(p, r + next_q)\n",
    "target_max = tq.max(dim=2)[0]\nloss = F.mse_loss(p, target_max)\n",
    "p = q_values.max(1)[0].detach()\nloss = F.mse_loss(p, y)\n",
    "m = q.max(dim=1, keepdim=True)[0]\nloss = (m + torch.log(torch.exp(q - m).sum(1))).mean()\n",
    "m = q.max(dim=0).values\nloss = F.mse_loss(m, y)\n",  # over the batch
    "m = logits.max(1)[0]\nloss = F.relu(1 - m).mean()\n",  # no Q-values
    "g = q_values.max(1)[0]\nprint(g)\n",  # reaches no loss
])
def test_bootstrap_sides_and_other_maxima_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "q.py"
    script.write_text("pred = q_values.max(1)[0]\nloss = F.mse_loss(pred, y)\n")
    rule = find_rule("greedy-q-trained")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [1]
    assert "gather" in found[0].fix
