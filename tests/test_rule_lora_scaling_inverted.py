"""lora-scaling-inverted (GD353): the quotients analysis/lora_scaling.py reads as a LoRA rank
divided by its alpha, and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.lora_scaling import inverted_lora_scalings


def _read(tmp_path, text):
    path = tmp_path / "lora.py"
    path.write_text(dedent(text))
    return [(line, quotient, rank, alpha) for line, quotient, _, _, rank, alpha in inverted_lora_scalings(str(path))]


@pytest.mark.parametrize("text, found", [
    ("class LoRA:\n    def __init__(self, r=4, alpha=16):\n        self.scaling = r / alpha\n",
     [(3, "r / alpha", 4.0, 16.0)]),
    ("# lora\ny = x @ A.T @ B.T * self.r / self.lora_alpha\n", [(2, "self.r / self.lora_alpha", None, None)]),
    ("import math\n# LoRA\nscale = math.sqrt(rank) / lora_alpha\n", [(3, "math.sqrt(rank) / lora_alpha", None, None)]),
    ("lora_r, lora_alpha = 8, 16\nscaling = lora_r / lora_alpha\n", [(2, "lora_r / lora_alpha", None, None)]),
    ("r = 8\nalpha = 32\nself.scaling = r / alpha\n", [(3, "r / alpha", 8.0, 32.0)]),  # no 'lora': a scaling
])
def test_a_rank_over_alpha_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "# lora\nself.scaling = alpha / r\n",
    "# lora\nimport math\nself.scaling = alpha / math.sqrt(r)\n",  # rsLoRA
    "# lora\ny = h * self.lora_alpha / self.r\n",
    "class L:\n    def __init__(self, r=16, alpha=16):\n        self.s = r / alpha\n",  # equal: a factor of 1
    "# lora\nper_group = r / groups\n",
    "ratio = r / alpha\n",  # no LoRA named, not a scaling
    "# lora\nw = (r * alpha) / alpha\n",
])
def test_right_way_round_and_other_quotients_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "lora.py"
    script.write_text("class LoRA:\n    def __init__(self, r=4, alpha=16):\n        self.scaling = r / alpha\n")
    rule = find_rule("lora-scaling-inverted")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [3]
    assert "16 times too small" in found[0].message
    assert "alpha / r" in found[0].fix
