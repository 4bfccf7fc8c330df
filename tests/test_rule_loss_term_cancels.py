"""loss-term-cancels (GD334): the source reading of + / - chains."""

from __future__ import annotations

import ast

from graddoctor.rules.loss_term_cancels import cancelled_terms


def found(src: str):
    return cancelled_terms(ast.parse(src))


def test_a_term_added_and_subtracted_in_one_chain_is_found():
    assert found("kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar)\n") == [
        (1, "1 + logvar - mu.pow(2) - logvar", "logvar")]
    assert len(found("loss = a - b.sum() + c + b.sum()\n")) == 1


def test_silent_on_groups_in_parentheses_different_terms_and_lone_differences():
    for src in ("y = z + (z_q - z)\n", "e = p * s + m - (y * s + m)\n",
                "kl = 1 + logvar - mu ** 2 - logvar.exp()\n", "d = a - a\n",
                "x = a + 1 - 1\n", "y = h - h.detach() + c\n"):
        assert found(src) == [], src
