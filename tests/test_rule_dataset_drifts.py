"""dataset-drifts (GD174): instrument/datasetreads.py's ``dataset_drift`` events (rows of a
dataset's arrays changed by a fetch of an index already served) and the rule's finding at the
in-place line of ``__getitem__``."""

from __future__ import annotations

import textwrap

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.rules import find_rule
from graddoctor.trace import Location, Trace

SLUG = "dataset-drifts"


class _Stored(Dataset):
    def __init__(self, how):
        self.data = torch.arange(40.0).reshape(20, 2)
        self.arr = np.arange(40.0).reshape(20, 2)
        self.filled = torch.zeros(20, dtype=torch.bool)
        self.reads = torch.zeros(20, dtype=torch.long)
        self.how = how

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if self.how == "torch":
            x = self.data[i]
            x.add_(1.0)
        elif self.how == "numpy":
            x = self.arr[i]
            x *= 2.0
            x = torch.from_numpy(x.copy())
        elif self.how == "clone":
            x = self.data[i].clone()
            x.add_(1.0)
        elif self.how == "counter":  # bookkeeping: a 1-D integer array
            self.reads[i] += 1
            x = self.data[i] * 1
        elif self.how == "cache":  # written at its first read only
            if not self.filled[i]:
                self.data[i] = self.data[i] * 2
                self.filled[i] = True
            x = self.data[i]
        return x, i


def _drifts(how, epochs=2, subset=False):
    rec = Recorder(step_budget=None)
    dataset = _Stored(how)
    with Instrumentation(rec):
        source = Subset(dataset, list(range(10, 20))) if subset else dataset
        for _ in range(epochs):
            for _ in DataLoader(source, batch_size=5):
                pass
    return [dict(e.data) for e in rec.trace if e.kind == "dataset_drift"]


def test_a_write_into_a_view_of_the_stored_rows_is_seen_at_the_second_read():
    [torch_drift] = _drifts("torch")
    assert torch_drift["attr"] == "data" and torch_drift["numpy"] is False
    assert torch_drift["rows"] == 5 and torch_drift["cls"] == "_Stored"
    [numpy_drift] = _drifts("numpy")
    assert numpy_drift["attr"] == "arr" and numpy_drift["numpy"] is True
    assert _drifts("torch", subset=True)[0]["attr"] == "data"  # a random_split's part


def test_no_drift_on_a_copy_a_cache_written_once_a_read_counter_or_a_single_read():
    assert _drifts("clone") == []
    assert _drifts("cache") == []
    assert _drifts("counter") == []
    assert _drifts("torch", epochs=1) == []  # each index read once: nothing read twice


GETITEM = '''
class D:
    def __getitem__(self, i):
        x = self.data[i]
        y = x.view(-1)
        z = self.data[i].clone()
        z.add_(1)
        {write}
        return y
'''


def _use(tmp_path, write):
    from graddoctor.analysis.source import stored_array_use

    path = tmp_path / "d.py"
    path.write_text(textwrap.dedent(GETITEM.format(write=write)))
    return stored_array_use(str(path), 3, "data")


def test_the_source_finds_the_write_into_the_read_or_its_views(tmp_path):
    assert _use(tmp_path, "y.mul_(2)")["write"][:3] == (8, "y.mul_(2)", "method")
    assert _use(tmp_path, "x += 1")["write"][2] == "augmented"
    assert _use(tmp_path, "x[0] = 1")["write"][2] == "item"
    assert _use(tmp_path, "torch.add(x, 1, out=y)")["write"][2] == "out"
    use = _use(tmp_path, "w = x * 2; w.add_(1)")
    assert use["write"] is None and use["read"][0] == 4


def _trace(tmp_path, write):
    path = tmp_path / "d.py"
    path.write_text(textwrap.dedent(GETITEM.format(write=write)))
    t = Trace()
    t.put(ev.dataset_drift(cls="D", attr="data", numpy=False, rows=3, fetches=9),
          Location(str(path), 3, "__getitem__"))
    return list(find_rule(SLUG)().check(Analysis(t)))


def test_the_finding_is_a_warning_at_the_write(tmp_path):
    [f] = _trace(tmp_path, "y.mul_(2)")
    assert f.severity is Severity.WARNING and f.location.line == 8
    assert "`y.mul_(2)`" in f.message and "mul" in f.fix and ".clone()" in f.fix
    assert f.related and f.related[0].location.line == 4
    [augmented] = _trace(tmp_path, "y -= 2")
    assert "(`y = y - 2`)" in augmented.fix
    [at_read] = _trace(tmp_path, "pass")
    assert at_read.location.line == 4
    assert list(find_rule(SLUG)().check(Analysis(Trace()))) == []
