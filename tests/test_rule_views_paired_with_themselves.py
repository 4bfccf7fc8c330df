"""views-paired-with-themselves (GD328): the two-view losses analysis/view_pairs.py reads as
pairing each view's prediction with its own view's stop-gradient target, and the rule over a
trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.view_pairs import views_paired_with_themselves


def _read(tmp_path, text):
    path = tmp_path / "ssl.py"
    path.write_text(dedent(text))
    return [(line, crossed) for line, _, crossed in views_paired_with_themselves(str(path))]


@pytest.mark.parametrize("text, found", [
    ("loss = D(p1, z1.detach()) + D(p2, z2.detach())\n",
     [(1, "loss = D(p1, z2.detach()) + D(p2, z1.detach())")]),
    ("with torch.no_grad():\n    t1, t2 = target(v1), target(v2)\nloss = (f(p1, t1) + f(p2, t2)).mean()\n",
     [(3, "loss = (f(p1, t2) + f(p2, t1)).mean()")]),
    ("class M(nn.Module):\n    def forward(self, a, b):\n        return p1, p2, z1.detach(), z2.detach()\n"
     "model = M()\np1, p2, z1, z2 = model(a, b)\nloss = -(crit(p1, z1).mean() + crit(p2, z2).mean()) * 0.5\n",
     [(6, "loss = -(crit(p1, z2).mean() + crit(p2, z1).mean()) * 0.5")]),
    ("def D(p, z):\n    z = z.detach()\n    return -(p * z).sum(1).mean()\nloss = D(p_one, z_one) / 2 + D(p_two, z_two) / 2\n",
     [(4, "loss = D(p_one, z_two) / 2 + D(p_two, z_one) / 2")]),
])
def test_each_view_paired_with_its_own_target_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "loss = D(p1, z2.detach()) + D(p2, z1.detach())\n",  # crossed
    "loss = F.mse_loss(r1, x1) + F.mse_loss(r2, x2)\n",  # reconstructions, no stop-gradient
    "loss = crit(out1, y1) + crit(out2, y2)\n",  # a Siamese classifier's labels
    "loss = D(p1, z1.detach())\n",  # one call alone
    "loss = D(p1, p1.detach()) + D(p2, p2.detach())\n",  # one stem: loss-compares-with-itself's
    "loss = D(pa, za.detach()) + D(pb, zb.detach())\n",  # no view numbers
])
def test_crossed_pairs_trained_targets_and_untagged_names_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "ssl.py"
    script.write_text("loss = D(p1, z1.detach()) + D(p2, z2.detach())\n")
    rule = find_rule("views-paired-with-themselves")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=1)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [1]
    assert "D(p1, z2.detach())" in found[0].fix
