"""straight-through-reversed (GD296): the sums analysis/straight_through.py reads as a
straight-through estimator with its signs swapped, and the rule over a trace's backwards."""

from __future__ import annotations

import pytest

from graddoctor.analysis.straight_through import reversed_straight_through


def _read(tmp_path, text):
    path = tmp_path / "st.py"
    path.write_text(text)
    return [(line, value) for line, _, value in reversed_straight_through(str(path))]


@pytest.mark.parametrize("text, found", [
    ("y = onehot + probs.detach() - probs\n", [(1, "probs")]),
    ("y = y_hard - y_soft + y_soft.detach()\n", [(1, "y_soft")]),
    ("a = F.one_hot(i, n) + sg(p) - p\n", [(1, "p")]),
    ("a = dist.sample() + dist.probs.detach() - dist.probs\n", [(1, "dist.probs")]),
    ("x = 1\nz = torch.round(h) - (h - h.detach())\n", [(2, "h")]),
])
def test_a_subtracted_value_with_its_detached_copy_added_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "y = onehot + probs - probs.detach()\n",
    "y = y_hard - y_soft.detach() + y_soft\n",
    "y = (y_hard - y_soft).detach() + y_soft\n",
    "y = y_soft + (y_hard - y_soft).detach()\n",
    "z = z_e + (z_q - z_e).detach()\n",
    "z = z_q + (z_e - z_q).detach()\n",  # another fault: no gradient to the encoder
    "g = x.detach() - x\n",  # two terms: a zero whose gradient is negated on purpose
    "g = 2 * x.detach() - x + y\n",  # a factor: a gradient reversal
    "d = a - b + c\n",
])
def test_right_estimators_and_other_sums_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "st.py"
    script.write_text("import torch\ncode = bits + p.detach() - p\n")
    rule = find_rule("straight-through-reversed")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [2]
    assert "`p.detach()`" in found[0].fix
