"""Small loops run under the instrumentation for the batch-pairing rules' tests
(labels-of-another-batch, inputs-permuted-without-labels): the ``batch_pairing`` events."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from graddoctor.instrument import Instrumentation, Recorder


def pairing(loop, rows: int = 64, batch_size: int = 8, shuffle: bool = True,
            classes: int = 2) -> list[tuple]:
    """``(problem, input_batch, target_batch, field)`` of the events of ``loop(loader, model)``
    (labels of ``classes`` values, at most 3)."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        features = torch.randn(rows, 3)
        labels = (features[:, 0] > 0).long() if classes == 2 else features[:, :classes].argmax(1)
        loader = DataLoader(TensorDataset(features, labels), batch_size=batch_size, shuffle=shuffle)
        model = torch.nn.Linear(3, max(classes, 2))
        loop(loader, model)
    return [(e["problem"], e["input_batch"], e["target_batch"], e["field"])
            for e in rec.trace.of_kind("batch_pairing")]


def ce(model, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()
