"""instrument/fullrows.py: which full-batch loss calls it records (a fixed N-row target, a
prediction of those N rows without a row selection, the target not the model's input, rows
reduced by the loss itself)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor.instrument.fullrows import FullRowsWatcher
from graddoctor.trace import Location


class _Rec:
    def __init__(self):
        self.events, self.errors = [], []

    def here(self, skip=2):
        return Location("train.py", 3)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        self.errors.append((where, exc))


torch.manual_seed(0)
N = 20
X = torch.randn(N, 4)
Y = torch.randint(0, 3, (N,))
MASK = torch.arange(N) < 10
W = torch.nn.Linear(4, 3)


def _calls(make, times=2, **kw):
    rec = _Rec()
    watcher = FullRowsWatcher(rec)
    for _ in range(times):
        out, target = make()
        watcher.loss_call("cross_entropy", out, target, (out, target), kw)
    assert rec.errors == []
    return rec.events


def test_the_same_full_target_at_two_calls_is_recorded_once():
    assert _calls(lambda: (W(X), Y), times=3) == [("full_rows_loss", {"fn": "cross_entropy", "rows": N})]
    assert _calls(lambda: (W(X), Y), times=1) == []  # one call: nothing to compare
    assert _calls(lambda: (W(X), Y.view(-1)), times=2) != []  # a view of the same rows
    assert _calls(lambda: (W(X), Y.float())) != []  # the same labels cast anew


def test_batches_selected_rows_inputs_and_per_row_losses_are_not_recorded():
    assert _calls(lambda: (W(X), torch.randint(0, 3, (N,)))) == []  # other labels each call
    assert _calls(lambda: (W(X)[MASK], Y[:10])) == []  # a selection in the prediction's graph
    feats = torch.randn(N, 3)
    assert _calls(lambda: (W(X) @ torch.eye(3) + torch.nn.Linear(3, 3)(feats) * 0, feats)) == []
    assert _calls(lambda: (torch.nn.Linear(3, 3)(feats.clone()), feats.clone())) == []  # a copy
    assert _calls(lambda: (W(X), Y), reduction="none") == []  # masked after the loss
    assert _calls(lambda: (W(X), Y), weight=MASK.float()) == []  # one weight per row
