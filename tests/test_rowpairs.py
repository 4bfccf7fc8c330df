"""instrument/rowpairs.py: a loop that slices its own batches, its inputs' rows against its
targets' rows (the ``row_pairing`` events read by inputs-permuted-without-labels)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.rowpairs import _row_key, pairs_agree


def _events(loop) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        X, Y = torch.randn(256, 5), torch.randint(0, 3, (256,))
        model = torch.nn.Linear(5, 3)
        for step in range(4):
            model.zero_grad()
            loop(step, X, Y, model)
    assert not rec.trace.of_kind("internal_error")
    return rec.trace.of_kind("row_pairing")


def test_row_keys_along_the_first_dimension_only():
    assert _row_key(slice(2, 5), 10) == slice(2, 5)
    assert _row_key((torch.tensor([1, 2]), slice(None)), 10).tolist() == [1, 2]
    assert _row_key([3, 1], 10).tolist() == [3, 1]
    assert _row_key(torch.ones(10, dtype=torch.bool), 10) is not None
    assert _row_key((slice(None), 0), 10) is None  # a column
    assert _row_key(torch.ones(2, 2, dtype=torch.long), 10) is None
    assert _row_key(3, 10) is None  # one row: its dimension goes
    assert pairs_agree(torch.tensor([4, 9, 2]), torch.tensor([4, 9, 2]))
    assert pairs_agree(torch.tensor([4, 9, 2]), torch.tensor([1, 6, -1]))  # a fixed horizon
    assert not pairs_agree(torch.tensor([4, 9, 2]), torch.tensor([9, 4, 2]))


def test_targets_left_in_order_beside_permuted_inputs_are_told_once_at_their_line():
    perm = torch.randperm(256)

    def loop(step, X, Y, model):
        xb = X[perm[step * 32:(step + 1) * 32]]
        yb = Y[step * 32:(step + 1) * 32]
        F.cross_entropy(model(xb), yb).backward()

    events = _events(loop)
    assert len(events) == 1
    e = events[0]
    assert e["rows"] == 32 and e["length"] == 256 and not e["same_rows"]
    assert e.loc.line == loop.__code__.co_firstlineno + 2  # the ``yb = ...`` line


def test_one_index_a_horizon_and_one_tensor_are_pairings():
    perm = torch.randperm(256)

    def same_index(step, X, Y, model):
        idx = perm[step * 32:(step + 1) * 32]
        F.cross_entropy(model(X[idx]), Y[idx]).backward()

    def both_shuffled(step, X, Y, model):
        Xs, Ys = X[perm], Y[perm]
        F.cross_entropy(model(Xs[step * 16:(step + 1) * 16]), Ys[step * 16:(step + 1) * 16]).backward()

    def horizon(step, X, Y, model):
        F.cross_entropy(model(X[step:step + 16]), Y[step + 3:step + 19]).backward()

    def own_rows(step, X, Y, model):  # an autoencoder: the target is the input's own tensor
        F.mse_loss(model(X[perm[:16]])[:, :3], X[perm[16:32]][:, :3]).backward()

    for loop in (same_index, both_shuffled, horizon, own_rows):
        assert _events(loop) == [], loop.__name__


def test_getitem_is_put_back_when_the_window_ends():
    before = torch.Tensor.__dict__.get("__getitem__")

    def loop(step, X, Y, model):
        F.cross_entropy(model(X[step:step + 8]), Y[step:step + 8]).backward()

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        X, Y = torch.randn(64, 5), torch.randint(0, 3, (64,))
        model = torch.nn.Linear(5, 3)
        for step in range(8):  # past the window
            loop(step, X, Y, model)
        assert torch.Tensor.__dict__.get("__getitem__") is before
    assert torch.Tensor.__dict__.get("__getitem__") is before
