"""embedding-normalised-across-rows (GD431): the table norms read by instrument/fieldrows.py,
the source's normalisations along dim 0, and the rule over hand-written traces."""

from __future__ import annotations

import ast

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument import fieldrows
from graddoctor.rules.embedding_normalised_across_rows import normalisations_across_rows
from rule_traces import builder, findings, only

SLUG = "embedding-normalised-across-rows"


class _Progress:
    steps = 0


class _Rec:
    def __init__(self):
        self.progress = _Progress()
        self.emitted = []

    def here(self, skip=2):
        return "loc"

    def emit(self, made, loc=None):
        self.emitted.append((made, loc))

    def internal_error(self, label, exc):
        raise exc


def _norms_told(normalise, steps=4, evaluation_at=()):
    torch.manual_seed(0)
    weight = torch.randn(40, 6, requires_grad=True)
    rec = _Rec()
    w = fieldrows.FieldRowsWatcher(rec)
    for step in range(1, steps + 1):
        rec.progress.steps = step
        with torch.no_grad():
            weight.add_(0.1 * torch.randn_like(weight))  # the optimizer's update
            if step not in evaluation_at:
                weight.copy_(normalise(weight))
        w._read_norms(weight)
    w.close()
    return [made for made, _ in rec.emitted if made[0] == "table_columns_unit"]


def test_the_watcher_tells_a_table_renormalised_across_its_rows():
    (kind, data), = _norms_told(lambda t: F.normalize(t, dim=0))
    assert (data["rows"], data["cols"], data["steps"], data["read"]) == (40, 6, 4, 4)


def test_the_watcher_allows_an_evaluation_read_between_a_step_and_the_renormalisation():
    (kind, data), = _norms_told(lambda t: F.normalize(t, dim=0), steps=5, evaluation_at=(3,))
    assert (data["steps"], data["read"]) == (4, 5)


def test_the_watcher_is_silent_on_rows_normalised_or_too_few_steps():
    assert _norms_told(lambda t: F.normalize(t, dim=1)) == []
    assert _norms_told(lambda t: t.renorm(2, 0, 1.0)) == []
    assert _norms_told(lambda t: F.normalize(t, dim=0), steps=2) == []
    assert _norms_told(lambda t: F.normalize(t, dim=0), steps=4, evaluation_at=(2, 3)) == []


def test_the_source_normalisations_along_dim_zero():
    tree = ast.parse(
        "a.weight.copy_(F.normalize(a.weight, p=2, dim=0))\n"
        "b.weight.data = b.weight.data / b.weight.data.norm(dim=0, keepdim=True)\n"
        "c.weight.copy_(F.normalize(c.weight, 2, 0))\n"
        "d.weight.copy_(F.normalize(d.weight, dim=1))\n"
        "x = F.normalize(feats, dim=0)\n"
        "e.weight.renorm_(2, 0, 1.0)\n")
    assert [line for line, _ in normalisations_across_rows(tree)] == [1, 2, 3]


def _trace(steps=6, read=6):
    t = builder(params=[0, 1])
    t.put(ev.table_columns_unit(api="nn.Embedding", rows=120, cols=24, steps=steps, read=read),
          line=30)
    return t


def test_the_rule_warns_at_the_lookup_without_a_source():
    f = only(_trace(), SLUG)
    assert f.location.line == 30 and f.evidence["steps"] == 6 and "dim=1" in f.fix


def test_the_rule_is_silent_without_the_event():
    assert findings(builder(params=[0, 1]), SLUG) == []


def test_the_watcher_leaves_a_normalised_copy_alone():
    torch.manual_seed(0)
    weight = torch.randn(40, 6, requires_grad=True)
    rec = _Rec()
    w = fieldrows.FieldRowsWatcher(rec)
    for step in range(1, 5):
        rec.progress.steps = step
        w._read_norms(F.normalize(weight, dim=0))  # read in the forward, never written back
    w.close()
    assert [made for made, _ in rec.emitted if made[0] == "table_columns_unit"] == []


def test_the_watcher_leaves_an_orthonormal_frame_alone():
    assert _norms_told(lambda t: torch.linalg.qr(t).Q) == []
