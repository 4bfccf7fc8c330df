"""label-of-another-sample (GD175): instrument/datasetreads.py's ``label_offset`` events (a
batch field equal to a held table's rows at index + k, beside inputs read at the index) and
the rule's finding at ``__getitem__``'s read of the label table."""

from __future__ import annotations

import textwrap

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.rules import find_rule
from graddoctor.trace import Location, Trace

SLUG = "label-of-another-sample"


class _Table(Dataset):
    def __init__(self, offset=1, ordered=False, numpy=False, labels_rows=64, same=False,
                 negative=False):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 3, generator=g)
        if ordered:  # a smooth series: consecutive rows near each other
            t = torch.arange(64.0)[:, None]
            x = torch.cat([torch.sin(t / 10), torch.cos(t / 10), t / 64], 1)
        y = torch.randint(0, 3, (labels_rows,), generator=g)
        self.x = x.numpy() if numpy else x
        self.y = y.numpy() if numpy else y
        self.offset, self.same, self.negative = offset, same, negative

    def __len__(self):
        return 60

    def __getitem__(self, i):
        if self.same:  # one table: the next row is the target (a language model's shift)
            return self.x[i], self.x[i + self.offset]
        if self.negative:  # the label table read at the index too: the shifted row is a negative
            return self.x[i], self.y[i], self.y[i + self.offset]
        return self.x[i], self.y[i + self.offset]


def _offsets(**kwargs):
    rec = Recorder(step_budget=None)
    dataset = _Table(**kwargs)
    with Instrumentation(rec):
        for _ in DataLoader(dataset, batch_size=8, shuffle=True,
                            generator=torch.Generator().manual_seed(1)):
            pass
    return [dict(e.data) for e in rec.trace if e.kind == "label_offset"]


def test_labels_read_at_another_row_of_an_unordered_table():
    [found] = _offsets(offset=1)
    assert (found["inputs"], found["labels"], found["offset"], found["field"]) == ("x", "y", 1, 1)
    assert found["samples"] >= 16
    assert _offsets(offset=-2, numpy=True)[0]["offset"] == -2


def test_silent_on_aligned_labels_a_series_one_table_and_an_id_table():
    assert _offsets(offset=0) == []
    assert _offsets(offset=1, ordered=True) == []  # a forecast of the next row
    assert _offsets(offset=1, same=True) == []  # the shift is the target
    assert _offsets(offset=1, labels_rows=65) == []  # a table indexed by 1-based ids
    assert _offsets(offset=1, negative=True) == []


GETITEM = '''
class D:
    def __getitem__(self, i):
        x = self.x[i]
        label = self.y[i + 1]
        return x, label
'''


def test_the_finding_is_at_the_label_read(tmp_path):
    path = tmp_path / "d.py"
    path.write_text(textwrap.dedent(GETITEM))
    t = Trace()
    t.put(ev.label_offset(cls="D", inputs="x", labels="y", offset=1, samples=24, field=1),
          Location(str(path), 3, "__getitem__"))
    [f] = find_rule(SLUG)().check(Analysis(t))
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert "row i + 1 of `self.y`" in f.message
    assert "`self.y[i]`, not `self.y[i + 1]`" in f.fix
    assert list(find_rule(SLUG)().check(Analysis(Trace()))) == []


def _sliced(x_rows: slice, y_rows: slice, ordered: bool = False):
    from torch.utils.data import TensorDataset
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 3, generator=g)
    if ordered:
        x = torch.sin(torch.arange(96.0)[:, None] / 10 + torch.arange(3.0))
    y = torch.randint(0, 3, (96,), generator=g)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(TensorDataset(x[x_rows], y[y_rows]), batch_size=8, shuffle=True,
                            generator=torch.Generator().manual_seed(1)):
            pass
    return [dict(e.data) for e in rec.trace if e.kind == "label_offset"]


def test_a_tensordataset_of_slices_at_different_starts():
    [found] = _sliced(slice(0, 64), slice(16, 80))
    assert found["sliced"] == [64, 0, 16] and found["offset"] == 16
    assert (found["inputs"], found["labels"]) == ("tensors[0]", "tensors[1]")


def test_slices_of_the_same_rows_or_an_ordered_table_are_silent():
    assert _sliced(slice(0, 64), slice(0, 64)) == []
    assert _sliced(slice(32, 96), slice(32, 96)) == []
    assert _sliced(slice(0, 64), slice(16, 80), ordered=True) == []


def test_the_sliced_finding_is_where_the_dataset_is_made(tmp_path):
    from graddoctor.options import CheckOptions
    from graddoctor.run.session import run_check
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x = torch.randn(200, 4)
        y = (x.sum(1) > 0).long()
        n = 150
        ds = TensorDataset(x[:n], y[10:10 + n])
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for xb, yb in DataLoader(ds, batch_size=16, shuffle=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    """))
    report = run_check(CheckOptions(target=str(script)))
    [f] = [f for f in report.findings if f.rule == SLUG]
    assert f.location.line == 8 and f.severity is Severity.WARNING
    assert "`y[:n]`" in f.fix and "`x[:n]`" in f.fix
