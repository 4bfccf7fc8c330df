"""instrument/handloss.py: a hand-written squared or absolute error broadcast to every pair."""

from __future__ import annotations

import torch

from graddoctor.instrument.handloss import broadcast_errors


def _root(loss):
    return loss.grad_fn


def test_a_column_prediction_against_a_flat_target_and_the_reverse():
    w = torch.randn(3, 1, requires_grad=True)
    x, y = torch.randn(6, 3), torch.randn(6)
    assert broadcast_errors(_root(((x @ w - y) ** 2).mean())) == [
        ("the hand-written squared error", [6, 1], [6], [6, 6])]
    flat = (x @ w).squeeze(1)
    assert broadcast_errors(_root((y.unsqueeze(1) - flat).abs().sum() / 6)) == [
        ("the hand-written absolute error", [6], [6, 1], [6, 6])]


def test_matching_shapes_pairwise_terms_and_other_exponents_are_not_read():
    w = torch.randn(3, 1, requires_grad=True)
    x, y = torch.randn(6, 3), torch.randn(6)
    pred = x @ w
    assert broadcast_errors(_root(((pred.squeeze(1) - y) ** 2).mean())) == []
    assert broadcast_errors(_root(((pred - y.unsqueeze(1)) ** 2).mean())) == []
    s = pred.squeeze(1)
    assert broadcast_errors(_root(((s[:, None] - s[None, :]) ** 2).mean())) == []  # both computed
    assert broadcast_errors(_root(((pred - y) ** 3).mean())) == []
    assert broadcast_errors(_root(((pred - torch.randn(4)) ** 2).mean())) == []  # (6, 4)
