"""max-indices-as-values (GD143): the source reading (analysis/source.py indices_as_values) and
the rule on a small script run in process."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.source import indices_as_values
from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "max-indices-as-values"


def _read(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return indices_as_values(str(path))


def test_positions_scaled_into_a_loss_target_or_compared_with_a_probability(tmp_path):
    assert _read(tmp_path, """\
        gamma = 0.99
        nxt = target(s2).max(1)[1]
        y = r + gamma * (1 - d) * nxt
        loss = F.smooth_l1_loss(q, y)
        conf = torch.max(probs, dim=1)[1]
        mask = conf >= 0.95
        m2 = probs.max(-1).indices.ge(0.9)
        """) == [(2, "target(s2).max(1)[1]", "target", 4), (5, "torch.max(probs, dim=1)[1]", "threshold", 6),
                 (7, "probs.max(-1).indices", "threshold", 7)]


def test_positions_used_as_positions_labels_or_decoded_for_a_metric_are_not(tmp_path):
    assert _read(tmp_path, """\
        gamma = 0.99
        a = q(s2).argmax(1, keepdim=True)
        y = r + gamma * target(s2).gather(1, a).squeeze(1)
        loss = F.smooth_l1_loss(q, y) + F.cross_entropy(logits, probs.argmax(1))
        values, idx = probs.max(1)
        mask = values >= 0.95
        fg = probs.argmax(1) > 0
        flat = probs.argmax(1) * 4 + 1
        shown = probs.argmax(1) * 0.1 + 2.0
        best = x.max()
        """) == []


def test_the_rule_reports_the_producer_line_once_a_backward_ran(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        q, t = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(q.parameters(), lr=0.1)
        gamma = 0.9
        for step in range(3):
            s, s2, r = torch.randn(8, 4), torch.randn(8, 4), torch.randn(8)
            with torch.no_grad():
                nxt = t(s2).max(1)[1]
                y = r + gamma * nxt
            loss = F.mse_loss(q(s).max(1)[0], y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        """))
    report = run_check(CheckOptions(target=str(script)))
    (f,) = [f for f in report.findings if f.rule == SLUG]
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert f.evidence["use"] == "target" and "`t(s2).max(1)[0]`" in f.fix


def test_a_name_a_function_assigns_stays_in_that_function(tmp_path):
    # an environment's step turns a one-hot action's position into a move: its `obs` is not the
    # training loop's `obs` that a world model's loss reads
    assert _read(tmp_path, """\
        def env_step(pos, a):
            pos = pos + (a.argmax(-1).float() * 2 - 1) * 0.2
            obs = torch.cat([pos[:, None], torch.sin(pos[:, None])], -1)
            return pos, obs

        obs = collect()
        loss = F.mse_loss(model(obs), obs)
        """) == []
    # a module-level value read in a function is still followed
    assert [use for _, _, use, _ in _read(tmp_path, """\
        nxt = target(s2).max(1)[1]
        y = r + 0.99 * nxt
        def update():
            return F.mse_loss(q, y)
        """)] == ["target"]
