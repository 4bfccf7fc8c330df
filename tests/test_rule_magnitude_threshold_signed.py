"""magnitude-threshold-signed (GD367): a threshold made from an order statistic of a tensor's
absolute values compared with the signed tensor (source only; the fixtures run the rule end
to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.magnitude_threshold_signed import _with_abs, signed_magnitude_comparisons


def _found(src):
    return [(line, base) for line, _, base in signed_magnitude_comparisons(ast.parse(src))]


def test_a_kthvalue_of_magnitudes_against_the_signed_weight():
    src = "def prune(p, k):\n    t = p.detach().abs().flatten().kthvalue(k).values\n    return p.detach() > t\n"
    assert _found(src) == [(3, "p")]


def test_inline_and_reversed_comparisons():
    assert _found("m = torch.quantile(w.abs(), 0.5) < w.data\n") == [(1, "w")]
    assert _found("keep = g >= g.abs().topk(4).values[-1]\n") == [(1, "g")]


def test_absolute_values_signed_cuts_and_other_tensors_are_silent():
    assert _found("t = w.abs().kthvalue(3).values\nm = w.abs() > t\n") == []
    assert _found("t = torch.quantile(w, 0.2)\nm = w > t\n") == []
    assert _found("t = w.abs().median()\nm = scores > t\n") == []
    assert _found("t = w.abs().max() * 0.1\nm = w > t\n") == []  # no order statistic


def test_the_fix_puts_abs_on_the_signed_side():
    assert _with_abs("p.detach() > thresh", "p") == "p.detach().abs() > thresh"
    assert _with_abs("thresh < p.data", "p") == "thresh < p.data.abs()"


def test_a_symmetric_clip_with_the_negated_threshold_is_silent():
    src = ("def clip(t):\n    bound = t.abs().flatten().quantile(0.95)\n"
           "    t = torch.where(t > bound, bound, t)\n    return torch.where(t < -bound, -bound, t)\n")
    assert _found(src) == []
