"""aggregate-divided-by-column-sums (GD269): hand-written traces, the pure judgement of
aggsum.py, and the watcher in-process over divisions of matrix products."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.aggsum import divided_by_columns
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "aggregate-divided-by-column-sums"


# -- the rule over hand-written events ----------------------------------------------------
def test_a_division_by_column_sums_is_a_warning_at_the_division():
    t = TraceBuilder()
    t.put(ev.aggregate_sum(op="mm", batched=False, differ=0.47, rows=50), 19)
    f = only(t, SLUG)
    assert f.severity.name == "WARNING" and f.location.line == 19
    assert "47%" in f.message and "no mean" in f.message
    assert "sum(dim=-1, keepdim=True)" in f.fix


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


# -- the judgement -------------------------------------------------------------------------
def _directed(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, n, generator=g) < 0.2).float()


def test_column_sums_of_a_directed_graph_are_told():
    adj = _directed()
    found = divided_by_columns(adj, adj.sum(0).clamp(min=1))
    assert found is not None and found["rows"] == 20 and found["differ"] > 0.05


def test_an_eps_on_the_column_sums_is_still_told():
    adj = _directed()
    assert divided_by_columns(adj, adj.sum(0) + 1e-8) is not None


def test_row_sums_are_right():
    adj = _directed()
    assert divided_by_columns(adj, adj.sum(1).clamp(min=1)) is None


def test_a_symmetric_matrix_has_one_sum():
    adj = _directed()
    sym = ((adj + adj.t()) > 0).float()
    assert divided_by_columns(sym, sym.sum(0).clamp(min=1)) is None


def test_negative_weights_are_not_judged():
    adj = _directed() - 0.5
    assert divided_by_columns(adj, adj.sum(0)) is None


def test_batched_graphs_are_judged_per_graph():
    adj = torch.stack([_directed(seed=s) for s in range(4)])
    assert divided_by_columns(adj, adj.sum(1).clamp(min=1)) is not None
    assert divided_by_columns(adj, adj.sum(2).clamp(min=1)) is None


# -- the watcher in-process ----------------------------------------------------------------
def _events(run):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        run()
    return [e for e in rec.trace if e.kind == "aggregate_sum"]


def test_a_product_divided_by_its_column_sums_is_told_once_per_line():
    adj = _directed()
    h = torch.randn(20, 4, requires_grad=True)

    def run():
        for _ in range(2):
            out = (adj @ h) / adj.sum(0).clamp(min=1).unsqueeze(1)
            out.sum().backward()

    found = _events(run)
    assert len(found) == 1
    assert found[0]["op"] == "mm" and found[0]["batched"] is False and found[0].loc is not None


def test_row_sums_and_divisions_after_the_first_backwards_are_not_told():
    adj = _directed()
    h = torch.randn(20, 4, requires_grad=True)

    def run():
        ((adj @ h) / adj.sum(1).clamp(min=1).unsqueeze(1)).sum().backward()
        ((adj @ h) / adj.sum(0).clamp(min=1).unsqueeze(1)).sum().backward()

    assert _events(run) == []
