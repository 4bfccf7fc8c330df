"""unshuffled-sorted-data (GD241): hand-written traces, and the ``batch_labels`` events the
DataLoader watcher records for loaders that never shuffle."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, findings, only

SLUG = "unshuffled-sorted-data"


def _loop(distinct, values, classes=4, size=16, backward=True, batches=8):
    t = builder()
    for i in range(batches):
        t.put(ev.batch_labels(loader=0, index=i, size=size, distinct=distinct(i),
                              value=values(i) if distinct(i) == 1 else None, classes=classes), 3)
        if backward:
            t.clear(P, line=6)
            t.backward(fresh=P, line=7, batch=[0, 0, i])
            t.step(line=8)
    return t


def test_single_class_batches_from_a_training_loader_are_a_warning_at_the_loader():
    f = only(_loop(lambda i: 2 if i == 3 else 1, lambda i: i // 4), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert f.evidence["single_class"] == 7 and f.evidence["batches"] == 8
    assert f.evidence["labels"] == [0, 1] and f.evidence["classes"] == 4


def test_silent_on_mixed_batches_small_batches_and_loaders_no_backward_uses():
    assert findings(_loop(lambda i: 1 if i < 3 else 3, lambda i: 0), SLUG) == []
    assert findings(_loop(lambda i: 1, lambda i: i // 4, size=2), SLUG) == []
    assert findings(_loop(lambda i: 1, lambda i: i // 4, backward=False), SLUG) == []


def test_one_class_is_silent_unless_the_dataset_says_it_holds_more():
    assert findings(_loop(lambda i: 1, lambda i: 0, classes=1), SLUG) == []
    assert findings(_loop(lambda i: 1, lambda i: 0, classes=None), SLUG) == []
    assert only(_loop(lambda i: 1, lambda i: 0, classes=10), SLUG).evidence["labels"] == [0]


def test_the_watcher_reads_labels_only_of_unshuffled_loaders_with_integer_labels():
    labels = torch.arange(2).repeat_interleave(8)
    data = TensorDataset(torch.randn(16, 3), labels)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for loader in (DataLoader(data, batch_size=4), DataLoader(data, batch_size=4, shuffle=True),
                       DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16)), batch_size=4)):
            for x, y in loader:
                pass
    events = rec.trace.of_kind("batch_labels")
    assert [(e["loader"], e["index"], e["distinct"], e["value"], e["classes"]) for e in events] == [
        (0, 0, 1, 0, 2), (0, 1, 1, 0, 2), (0, 2, 1, 1, 2), (0, 3, 1, 1, 2)]


def _value_loop(batch_values, slot="target", backward=True):
    t = builder()
    for i, values in enumerate(batch_values):
        v = torch.tensor(values, dtype=torch.float64)
        var, mean = torch.var_mean(v, correction=0)
        t.put(ev.batch_spread(loader=0, index=i, size=len(values), slot=slot, mean=float(mean),
                              var=float(var), low=float(v.min()), high=float(v.max())), 3)
        if backward:
            t.clear(P, line=6)
            t.backward(fresh=P, line=7, batch=[0, 0, i])
            t.step(line=8)
    return t


def test_values_sorted_across_batches_are_a_warning_at_the_loader():
    ordered = torch.sort(torch.randn(64, generator=torch.Generator().manual_seed(0))).values
    f = only(_value_loop(ordered.reshape(8, 8).tolist()), SLUG)
    assert f.location.line == 3 and f.evidence["sorted"] and f.evidence["slot"] == "target"
    falling = only(_value_loop(ordered.flip(0).reshape(8, 8).tolist(), slot="input"), SLUG)
    assert falling.evidence["sorted"] and "below" in falling.message


def test_values_grouped_in_narrow_bands_are_reported_unsorted_too():
    bands = [[float(b % 3) + 0.01 * j for j in range(8)] for b in range(8)]  # 0, 1, 2, 0, 1, ...
    f = only(_value_loop(bands), SLUG)
    assert not f.evidence["sorted"] and f.evidence["within_share"] < 0.02


def test_values_mixed_in_every_batch_few_batches_or_no_backward_are_silent():
    mixed = torch.randn(64, generator=torch.Generator().manual_seed(1)).reshape(8, 8).tolist()
    assert findings(_value_loop(mixed), SLUG) == []
    ordered = torch.arange(64.0).reshape(8, 8).tolist()
    assert findings(_value_loop(ordered[:3]), SLUG) == []
    assert findings(_value_loop(ordered, backward=False), SLUG) == []
    assert findings(_value_loop([[1.0] * 8] * 8), SLUG) == []  # a constant: nothing ordered


def test_the_watcher_reads_one_float_per_sample_of_unshuffled_loaders():
    x = torch.linspace(0, 1, 16).unsqueeze(1)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for loader in (DataLoader(TensorDataset(x, x.squeeze(1) * 2), batch_size=4),
                       DataLoader(TensorDataset(x, x * 2), batch_size=4, shuffle=True),
                       DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 2)), batch_size=4)):
            for xb, yb in loader:
                pass
    events = rec.trace.of_kind("batch_spread")
    assert [(e["loader"], e["index"], e["slot"]) for e in events] == [
        (0, i, slot) for i in range(4) for slot in ("input", "target")]
    assert events[1]["low"] == 0.0 and abs(events[1]["high"] - 2 * 3 / 15) < 1e-6
