"""embedding-fields-share-rows (GD268): hand-written traces, the pure judgement of
fieldrows.py, and the watcher in-process over F.embedding and nn.Embedding lookups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.fieldrows import shared_fields
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "embedding-fields-share-rows"


# -- the rule over hand-written events ----------------------------------------------------
def test_fields_without_offsets_are_a_warning_at_the_lookup():
    t = TraceBuilder()
    t.put(ev.field_rows(api="nn.Embedding", rows=34, fields=4, calls=8, sizes=[10, 7, 5, 12],
                        covered=34, top=12), 21)
    f = only(t, SLUG)
    assert f.severity.name == "WARNING" and f.location.line == 21
    assert "one table of 34 rows" in f.message and "10, 7, 5, 12" in f.message
    assert "last 22 rows are never trained" in f.message
    assert "x + offsets" in f.fix


def test_many_fields_are_listed_short():
    t = TraceBuilder()
    t.put(ev.field_rows(api="F.embedding", rows=90, fields=9, calls=3, sizes=[10] * 9,
                        covered=90, top=10), 5)
    assert "and 3 more" in only(t, SLUG).message


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


# -- the judgement -------------------------------------------------------------------------
def _ranges(*columns):
    low = torch.tensor([c[0] for c in columns])
    high = torch.tensor([c[1] for c in columns])
    return low, high


def test_columns_from_zero_that_fill_the_table_share_its_rows():
    found = shared_fields(*_ranges((0, 9), (0, 6), (0, 4), (0, 11)), 34)
    assert found == {"sizes": [10, 7, 5, 12], "covered": 34, "top": 12}


def test_a_padding_row_and_unseen_top_values_still_count():
    assert shared_fields(*_ranges((1, 9), (1, 6), (0, 9)), 30) is not None  # 28 of 30 rows


def test_columns_one_after_the_other_are_fields_with_offsets():
    assert shared_fields(*_ranges((0, 9), (10, 16), (17, 21), (22, 33)), 34) is None


def test_columns_over_the_whole_vocabulary_are_tokens():
    assert shared_fields(*_ranges((0, 49), (0, 48), (0, 49)), 50) is None


def test_a_table_far_larger_than_the_fields_is_not_judged():
    assert shared_fields(*_ranges((0, 9), (0, 6)), 1000) is None


def test_negative_ids_are_not_judged():
    assert shared_fields(*_ranges((-1, 9), (0, 6)), 17) is None


# -- the watcher in-process ----------------------------------------------------------------
def _events(run):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        run()
    return [e for e in rec.trace if e.kind == "field_rows"]


def _fields(dims, rows, shift):
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randint(0, d, (rows,), generator=g) for d in dims], 1)
    return x + torch.tensor([0, *torch.tensor(dims).cumsum(0)[:-1].tolist()]) if shift else x


def test_an_nn_embedding_over_unshifted_fields_is_told_once_at_its_line():
    dims = [6, 3, 9]
    emb = nn.Embedding(sum(dims), 4)

    def run():
        for _ in range(4):
            emb(_fields(dims, 16, shift=False)).sum().backward()

    found = _events(run)
    assert len(found) == 1
    e = found[0]
    assert e["api"] == "nn.Embedding" and e["rows"] == 18 and e["fields"] == 3 and e["calls"] == 4
    assert e["sizes"] == [6, 3, 9] and e.loc is not None


def test_shifted_fields_and_a_frozen_table_are_not_told():
    dims = [6, 3, 9]
    weight = torch.randn(sum(dims), 4, requires_grad=True)
    frozen = torch.randn(sum(dims), 4)

    def run():
        for _ in range(4):
            F.embedding(_fields(dims, 16, shift=True), weight).sum().backward()
            F.embedding(_fields(dims, 16, shift=False), frozen)

    assert _events(run) == []


def test_too_few_rows_read_are_not_judged():
    dims = [6, 3, 9]
    weight = torch.randn(sum(dims), 4, requires_grad=True)

    def run():
        F.embedding(_fields(dims, 16, shift=False), weight).sum().backward()

    assert _events(run) == []
