"""contrastive-margin-reversed (GD335): the source reading of contrastive sums."""

from __future__ import annotations

import ast

from graddoctor.rules.contrastive_margin_reversed import reversed_margins


def found(src: str):
    return reversed_margins(ast.parse(src))


def test_the_dissimilar_pairs_hinged_on_d_minus_margin_are_found_either_way_round():
    assert found("l = same * d.pow(2) + (1 - same) * F.relu(d - m).pow(2)\n") == [
        (1, "(1 - same) * F.relu(d - m).pow(2)", "d")]
    assert len(found("l = (1 - y) * d ** 2 + y * torch.clamp(d - margin, min=0) ** 2\n")) == 1


def test_silent_on_the_right_hinge_a_double_margin_and_unrelated_indicators():
    for src in ("l = same * d.pow(2) + (1 - same) * F.relu(m - d).pow(2)\n",
                "l = y * F.relu(d - m_pos).pow(2) + (1 - y) * F.relu(m_neg - d).pow(2)\n",
                "l = a * d ** 2 + b * F.relu(d - m) ** 2\n",
                "l = y * x ** 2 + (1 - y) * F.relu(d - m) ** 2\n"):
        assert found(src) == [], src


def test_terms_bound_to_names_are_read_through_their_binding():
    src = ("def step(same, d, m):\n"
           "    pos = same * d.pow(2)\n"
           "    neg = (1 - same) * F.relu(d - m).pow(2)\n"
           "    return (pos + neg).mean()\n")
    (line, term, distance), = found(src)
    assert line == 3 and distance == "d" and term.startswith("(1 - same)")
    right = src.replace("F.relu(d - m)", "F.relu(m - d)")
    assert found(right) == []
    rebound = src.replace("    return", "    neg = (1 - same) * F.relu(m - d).pow(2)\n    return")
    assert found(rebound) == []  # the sum reads the last binding
