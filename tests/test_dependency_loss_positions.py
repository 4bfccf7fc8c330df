"""Which of a model's output positions a loss reads through a slice of the logits
(dependency.py's ``_loss_positions``): the shift of the targets is measured against those."""

from __future__ import annotations

import torch

from graddoctor.instrument.dependency import _UNREAD, _loss_positions, _shift


def _out():
    return torch.randn(2, 9, 5, requires_grad=True) * 1.0  # (B, T, V) with a node of its own


def test_slices_narrow_steps_and_negative_starts_are_followed():
    out = _out()
    assert _loss_positions(out[:, 1:].grad_fn, out) == list(range(1, 9))
    assert _loss_positions(out[:, :-1][:, 2:].grad_fn, out) == list(range(2, 8))
    assert _loss_positions(out[:, -3:].grad_fn, out) == [6, 7, 8]
    assert _loss_positions(out[:, ::2].grad_fn, out) == [0, 2, 4, 6, 8]
    assert _loss_positions(out.narrow(1, 2, 3).grad_fn, out) == [2, 3, 4]
    assert _loss_positions(out[:, torch.tensor([1, 5])].grad_fn, out) == [1, 5]


def test_layout_keeping_ops_and_a_transpose_for_the_class_axis_are_followed():
    out = _out()
    flat = (out[:, 3:].log_softmax(-1) / 2.0).reshape(-1, 5)
    assert _loss_positions(flat.grad_fn, out) == list(range(3, 9))
    assert _loss_positions(out[:, 1:].transpose(1, 2).grad_fn, out) == list(range(1, 9))
    assert _loss_positions(out.grad_fn, out) == list(range(9))


def test_what_is_not_followed():
    out = _out()
    assert _loss_positions(out.reshape(-1, 5)[3:].grad_fn, out) is _UNREAD  # a view, then a slice
    assert _loss_positions(out[:, 4].grad_fn, out) is _UNREAD  # one position selected
    assert _loss_positions(out[1:].grad_fn, out) is _UNREAD  # a slice of the batch
    other = torch.randn(2, 9, 5, requires_grad=True) * 1.0
    assert _loss_positions(other[:, 1:].grad_fn, out) is None  # not made from the output
    assert _loss_positions(None, out) is None


def test_the_shift_is_measured_at_the_positions_read():
    seq = torch.randint(0, 50, (4, 12))
    ids = seq[:, :-1]  # the model reads 11 tokens; the loss reads positions 1..10
    positions = list(range(1, 11))
    assert _shift(ids, seq[:, 2:], -100, positions) == 1  # a prompt of 2: next-token targets
    assert _shift(ids, seq[:, 2:], -100) == 2  # read as positions 0..9: "shifted twice"
    assert _shift(ids, seq[:, 1:11], -100, positions) == 0
