"""sampler-reach (GD232): hand-written traces, and the DataLoader watcher's loader_sampler
event for a WeightedRandomSampler given one weight per class."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "sampler-reach"


def described(**kw):
    t = TraceBuilder()
    data = dict(loader=0, sampler="WeightedRandomSampler", shuffle=True, dataset_len=200,
                reach=3, weights=3)
    data.update(kw)
    t.put(ev.loader_sampler(**data), 4)
    return t


def test_one_weight_per_class_is_a_warning_at_the_sampler():
    f = only(described(), SLUG)
    assert f.location.line == 4 and "3 weights for a dataset of 200" in f.message
    assert "per sample" in f.fix


def test_weights_named_per_sample_are_reported_where_they_are_assigned(tmp_path):
    from graddoctor.rules.sampler_reach import per_sample_name_assignment
    import ast
    text = ("w = 1.0 / counts\n"
            "sample_weights = w\n"
            "sampler = WeightedRandomSampler(sample_weights, num_samples=200)\n")
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.put(ev.loader_sampler(loader=0, sampler="WeightedRandomSampler", shuffle=True,
                            dataset_len=200, reach=3, weights=3), 3)
    f = only(t, SLUG)
    assert f.location.line == 2 and f.message.startswith("`sample_weights = w` makes one weight per class")
    assert [r.location.line for r in f.related] == [3]
    tree = ast.parse(text.replace("sample_weights", "class_weights"))
    assert per_sample_name_assignment(tree, 3) is None  # named per class: the sampler's line


def test_one_weight_per_sample_is_silent_even_with_zeros():
    assert findings(described(weights=200, reach=150), SLUG) == []


def test_a_sampler_over_a_smaller_dataset_is_a_warning():
    f = only(described(sampler="RandomSampler", weights=None, reach=50), SLUG)
    assert "built over 50 samples" in f.message


def test_unknown_lengths_are_silent():
    assert findings(described(dataset_len=None), SLUG) == []
    assert findings(described(sampler="SubsetRandomSampler", weights=None, reach=None), SLUG) == []


def test_the_watcher_sees_the_weights_and_the_dataset():
    rec = Recorder(step_budget=None)
    ds = TensorDataset(torch.randn(20, 2))
    with Instrumentation(rec):
        sampler = WeightedRandomSampler(torch.tensor([1.0, 3.0]), num_samples=20)
        batches = list(DataLoader(ds, batch_size=5, sampler=sampler))
    assert len(batches) == 4
    (e,) = [e for e in rec.trace if e.kind == "loader_sampler"]
    assert e.get("weights") == 2 and e.get("dataset_len") == 20 and e.get("shuffle") is True
