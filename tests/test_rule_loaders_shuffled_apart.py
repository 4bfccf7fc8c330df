"""loaders-shuffled-apart (GD242): the ``loaders_zipped`` event the DataLoader watcher records
for two shuffling loaders read together, one of bare labels, and the rule's finding."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "loaders-shuffled-apart"


def test_the_event_is_a_warning_at_the_labels_loader():
    t = builder()
    t.put(ev.loaders_zipped(inputs=0, labels=1, length=256), 11)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert f.evidence == {"inputs_loader": 0, "labels_loader": 1, "length": 256}
    assert findings(builder(), SLUG) == []


def _zipped(make_x, make_y, loss=torch.nn.functional.cross_entropy):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        features = torch.randn(64, 3)
        labels = (features[:, 0] > 0).long()
        model = torch.nn.Linear(3, 2)
        for x, y in zip(make_x(features), make_y(labels)):
            x = x[0] if isinstance(x, list) else x
            y = y[0] if isinstance(y, list) else y
            loss(model(x), y).backward()
    return [(e["inputs"], e["labels"], e["length"]) for e in rec.trace.of_kind("loaders_zipped")]


def test_the_watcher_records_two_own_orders_of_one_length_with_bare_labels():
    shuffled = lambda data: DataLoader(TensorDataset(data), batch_size=8, shuffle=True)  # noqa: E731
    assert _zipped(shuffled, shuffled) == [(0, 1, 64)]
    assert _zipped(shuffled, lambda data: DataLoader(data, batch_size=8, shuffle=True)) == [(0, 1, 64)]


def test_the_watcher_stays_silent_on_shared_or_no_orders_and_unlabelled_pairs():
    seeded = lambda data: DataLoader(data, batch_size=8, shuffle=True,  # noqa: E731
                                     generator=torch.Generator().manual_seed(1))
    in_order = lambda data: DataLoader(data, batch_size=8)  # noqa: E731
    assert _zipped(seeded, seeded) == []
    assert _zipped(in_order, in_order) == []
    images = lambda data: DataLoader(TensorDataset(data.float()), batch_size=8, shuffle=True)  # noqa: E731
    assert _zipped(images, images, lambda out, y: (out[:, 0] - y).pow(2).mean()) == []
