"""hidden-state-not-detached (GD110): the rule on hand-written traces, and the instrumentation
that feeds it (the history walk of retained backwards, instrument/backward.py)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from conftest import FIXTURES
from graddoctor.analysis import Analysis
from graddoctor.run.session import run_check
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument import backward as bw
from graddoctor.options import CheckOptions
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder

SLUG = "hidden-state-not-detached"
P = [0, 1]


def findings(t: TraceBuilder):
    return list(find_rule(SLUG)().check(Analysis(t.trace)))


def builder() -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    return t


def tbptt(t: TraceBuilder, updates: int, line: int = 10, nodes=None, shared_pids=P):
    """``updates`` updates of zero_grad / retained backward / step, each backward reaching the
    graphs of all earlier ones (what the instrumentation writes for an undetached h)."""
    earlier = []
    for i in range(updates):
        t.clear(P, line=line - 1)
        history = [[seq, list(shared_pids)] for seq in earlier]
        b = t.backward(fresh=P, line=line, graph_nodes=(nodes or (lambda k: 10 * (k + 1)))(i),
                       history=history)
        earlier.append(b.seq)
        t.step(0, line=line + 1)
    return t


# -- the rule on traces ----------------------------------------------------------------------
def test_history_applied_by_a_step_is_found_at_the_backward_line():
    [f] = findings(tbptt(builder(), 4))
    assert f.severity is Severity.WARNING and f.location.line == 10
    assert "update 1, whose gradients step 1 already applied" in f.message
    assert "(graph: 10 → 20 → 30 → 40 nodes)" in f.message
    assert [r.location.line for r in f.related] == [11]  # the step; the earlier backward is this line
    assert f.evidence["occurrences"] == 3 and f.evidence["params"] == ["p0", "p1"]
    assert f.step == 2
    assert "crashed" not in f.message


def test_accumulated_chunks_are_found_from_the_first_update_boundary_on():
    t = builder()  # two chunks per update, h never detached
    seqs = []
    for update in range(2):
        t.clear(P, line=9)
        for chunk in range(2):
            b = t.backward(fresh=P, line=10, graph_nodes=10 * (len(seqs) + 1),
                           history=[[s, P] for s in seqs])
            seqs.append(b.seq)
        t.step(0, line=11)
    [f] = findings(t)
    assert f.step == 2 and f.evidence["occurrences"] == 2  # the 2 backwards of update 2
    assert "graph of update 1, whose gradients step 1 already applied" in f.message


def test_the_first_backward_of_the_history_is_related_when_on_another_line():
    t = builder()
    t.clear(P, line=2)
    first = t.backward(fresh=P, line=3, graph_nodes=5, history=[])
    t.step(0, line=4)
    t.clear(P, line=5)
    t.backward(fresh=P, line=6, graph_nodes=9, history=[[first.seq, P]])
    [f] = findings(t)
    assert f.location.line == 6 and {r.location.line for r in f.related} == {3, 4}


def test_history_shared_within_one_update_is_silent():
    t = builder()
    t.clear(P)
    a = t.backward(fresh=P, graph_nodes=9, history=[])
    t.backward(accumulated=P, graph_nodes=10, history=[[a.seq, P]])  # multi-task: loss2
    t.step(0)
    assert findings(t) == []


def test_a_step_of_an_optimizer_that_does_not_own_the_shared_params_is_silent():
    t = TraceBuilder()  # GAN: G = [0, 1], D = [2, 3]
    t.optimizer(0, [0, 1])
    t.optimizer(1, [2, 3])
    for _ in range(3):
        d = t.backward(fresh=[0, 1, 2, 3], graph_nodes=18, history=[])
        t.step(1)
        t.clear([0, 1], opt=0)
        t.backward(fresh=[0, 1], accumulated=[2, 3], graph_nodes=11, history=[[d.seq, [0, 1]]])
        t.step(0)
        t.clear([2, 3], opt=1)
    assert findings(t) == []


def test_shared_nodes_without_tracked_parameters_are_silent():
    assert findings(tbptt(builder(), 4, shared_pids=[])) == []


def test_a_skipped_step_in_between_applied_nothing():
    t = builder()
    a = t.backward(fresh=P, graph_nodes=5, history=[])
    t.step(0, skipped=True)
    t.backward(accumulated=P, graph_nodes=9, history=[[a.seq, P]])
    assert findings(t) == []


def test_history_naming_events_that_are_not_earlier_backwards_is_ignored():
    t = builder()
    s = t.step(0)
    t.backward(fresh=P, graph_nodes=5, history=[[s.seq, P], [999, P]])
    assert findings(t) == []


def test_the_crash_right_after_is_explained():
    t = tbptt(builder(), 2)
    t.clear(P, line=9)
    earlier = [e.seq for e in t.trace.events if e.kind == "backward"]
    t.backward(fresh=P, line=10, graph_nodes=30, history=[[s, P] for s in earlier])
    t.param(5, "late.weight")  # names are written after the end
    t.event("run_end", status="crashed", steps=2)
    [f] = findings(t)
    assert "crashed right after this backward" in f.message and "inplace operation" in f.message


def test_a_crash_elsewhere_is_not_blamed_on_it():
    t = tbptt(builder(), 3)
    t.event("run_end", status="crashed", steps=3)  # after a step: not in the backward
    [f] = findings(t)
    assert "crashed" not in f.message


# -- growth alone, when the history could not be looked at ------------------------------------
def unchecked(t: TraceBuilder, counts, line=10, steps=True):
    for n in counts:
        t.backward(fresh=P, line=line, graph_nodes=n, history=None)
        if steps:
            t.step(0, line=line + 1)
    return t


def test_a_graph_that_grows_over_three_updates_unchecked_is_info():
    [f] = findings(unchecked(builder(), [100, 200, 300]))
    assert f.severity is Severity.INFO and f.location.line == 10
    assert "grew from 100 to 300 nodes over 3 updates" in f.message
    assert f.evidence["graph_nodes"] == [100, 200, 300]


@pytest.mark.parametrize("counts", [[100, 200], [100, 120, 150], [100, 300, 250], [100, 100, 100]])
def test_too_few_too_slow_or_not_growing_is_silent(counts):
    assert findings(unchecked(builder(), counts)) == []


def test_growth_within_one_update_does_not_count():
    assert findings(unchecked(builder(), [100, 200, 300], steps=False)) == []


def test_growth_of_a_graph_whose_history_was_checked_is_silent():
    t = builder()
    for n in (100, 200, 300, 400):  # a curriculum of longer sequences: nothing shared
        t.backward(fresh=P, graph_nodes=n, history=[], line=10)
        t.step(0, line=11)
    assert findings(t) == []


# -- the instrumentation -----------------------------------------------------------------------
def _backwards(rec):
    return [e for e in rec.trace.events if e.kind == "backward"]


class Leaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(3, 4), nn.Linear(4, 1)
        self.decay = nn.Parameter(torch.zeros(4))

    def forward(self, x, h):
        h = torch.sigmoid(self.decay) * h + self.inp(x)
        return self.out(h), h


def _leaky_run(steps: int, detach: bool, retain=lambda loss: loss.backward(retain_graph=True)):
    torch.manual_seed(0)
    model = Leaky()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = torch.zeros(2, 4)
    for _ in range(steps):
        opt.zero_grad()
        pred, h = model(torch.randn(2, 3), h.detach() if detach else h)
        retain(pred.pow(2).mean())
        opt.step()
    return model


def test_a_retained_backward_names_the_earlier_backwards_it_reaches():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _leaky_run(3, detach=False)
        pids = sorted(rec.pid(p) for p in (model.decay, model.inp.weight, model.inp.bias))
    b = _backwards(rec)
    assert b[0]["history"] == [] and b[1]["history"] == [[b[0].seq, pids]]
    assert b[2]["history"] == [[b[0].seq, pids], [b[1].seq, pids]]
    assert b[0]["graph_nodes"] < b[1]["graph_nodes"] < b[2]["graph_nodes"]


def test_detached_state_shares_nothing():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _leaky_run(3, detach=True)
    assert [b["history"] for b in _backwards(rec)] == [[], [], []]
    assert len({b["graph_nodes"] for b in _backwards(rec)}) == 1


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("call", [
    lambda loss: loss.backward(None, True),  # positional retain_graph
    lambda loss: loss.backward(create_graph=True),  # retain_graph defaults to create_graph
    lambda loss: torch.autograd.backward([loss], None, True),
    lambda loss: torch.autograd.backward(loss, retain_graph=True),
], ids=["positional", "create_graph", "autograd-positional", "autograd-keyword"])
def test_every_way_of_retaining_the_graph_is_seen(call):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _leaky_run(2, detach=False, retain=call)
    b = _backwards(rec)
    assert b[1]["history"] and b[1]["history"][0][0] == b[0].seq


def test_normal_backwards_are_not_walked_for_history(monkeypatch):
    calls = []
    original = bw._history_walk
    monkeypatch.setattr(bw, "_history_walk", lambda *a, **k: calls.append(1) or original(*a, **k))
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        _leaky_run(4, detach=True, retain=lambda loss: loss.backward())
        _leaky_run(2, detach=True, retain=lambda loss: loss.backward(retain_graph=False))
    assert calls == []
    assert all(b["graph_nodes"] is None and b["history"] is None for b in _backwards(rec))


def test_the_marks_do_not_change_what_the_user_computes():
    plain = _leaky_run(6, detach=False)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        checked = _leaky_run(6, detach=False)
    for p, q in zip(plain.parameters(), checked.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)


def test_a_deep_graph_is_walked_without_recursion():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        w = nn.Parameter(torch.ones(1))
        opt = torch.optim.SGD([w], lr=0.0)
        h = torch.zeros(1)
        for _ in range(2):
            opt.zero_grad()
            for _ in range(25_000):  # 50,000 nodes over the two updates
                h = h + w
            h.sum().backward(retain_graph=True)
            opt.step()
    first, second = _backwards(rec)
    assert first["graph_nodes"] > 25_000 and second["graph_nodes"] > 50_000
    assert second["history"] == [[first.seq, [rec.pid(w)]]]


def _chain(n: int):
    w = nn.Parameter(torch.ones(1))
    h = torch.zeros(1)
    for _ in range(n):
        h = h * 1.0 + w
    return h.sum(), w


def test_past_the_limit_the_walk_only_counts_and_finds_leaves():
    loss, w = _chain(40)
    run = object()
    first = [0, run]
    bw._history_walk(loss, first, limit=1000)  # an earlier backward marks the whole graph
    leaves, nodes, shared, complete = bw._history_walk(loss, [1, run], limit=5)
    assert nodes >= 80 and not complete and [id(v) for v in leaves] == [id(w)]
    assert len(shared) <= 1  # only what the first 5 nodes feed was looked at
    leaves, nodes, shared, complete = bw._history_walk(loss, [2, run])
    assert complete and [cell for cell, _ in shared.values()] == [first]


def test_marks_of_another_run_are_replaced_not_reported():
    loss, w = _chain(5)
    bw._history_walk(loss, [0, object()])  # a run that ended, its graph still alive
    mine = object()
    assert bw._history_walk(loss, [1, mine])[2] == {}
    shared = bw._history_walk(loss, [2, mine])[2]
    assert [cell[0] for cell, _ in shared.values()] == [1]


class _Node:
    """A stand-in autograd node: next_functions, and metadata that may be missing."""

    def __init__(self, children=(), metadata=True):
        self.next_functions = tuple((c, 0) for c in children)
        self._metadata = {} if metadata else None

    @property
    def metadata(self):
        if self._metadata is None:
            raise RuntimeError("no metadata on this node")
        return self._metadata


class _Leaf:
    def __init__(self, variable):
        self.variable = variable


def test_a_node_without_metadata_ends_the_looking_not_the_walk(monkeypatch):
    monkeypatch.setattr(bw, "_ACCUMULATE_GRAD", _Leaf)
    x, y = torch.ones(1), torch.zeros(1)
    root = _Node([_Node([_Leaf(x)], metadata=False), _Node([_Leaf(y)])])

    class Rooted(torch.Tensor):  # a tensor whose grad_fn is the stand-in
        grad_fn = property(lambda self: root)

    leaves, nodes, shared, complete = bw._history_walk(torch.ones(1).as_subclass(Rooted), [None, None])
    assert nodes == 3 and {id(v) for v in leaves} == {id(x), id(y)}
    assert not complete and shared == {}


# -- whole runs --------------------------------------------------------------------------------
def _check(path: str, *args: str, monkeypatch):
    monkeypatch.chdir(os.path.dirname(path))
    from test_fixtures import options_for

    return run_check(options_for(os.path.basename(path), list(args)))


def test_the_grucell_fixture_run_to_its_crash_is_explained(monkeypatch):
    report = _check(os.path.join(FIXTURES, "tbptt", "bad_tbptt_grucell.py"), monkeypatch=monkeypatch)
    assert report.run.status == "crashed" and "inplace operation" in report.run.error["message"]
    [f] = [f for f in report.findings if f.rule == SLUG]
    assert f.location.line == 21 and "crashed right after this backward" in f.message
    assert not report.internal_errors


def test_chunks_of_several_steps_crash_on_the_second_chunk_and_are_explained(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "torch.manual_seed(0)\n"
        "rnn, head = nn.RNNCell(3, 8), nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)\n"
        "h = torch.zeros(2, 8)\n"
        "for chunk in range(6):\n"
        "    opt.zero_grad()\n"
        "    for t in range(4):\n"
        "        h = rnn(torch.randn(2, 3), h)\n"
        "    head(h).pow(2).mean().backward(retain_graph=True)\n"
        "    opt.step()\n")
    report = _check(str(script), monkeypatch=monkeypatch)
    assert report.run.status == "crashed"
    [f] = [f for f in report.findings if f.rule == SLUG]
    assert f.location.line == 11 and "crashed right after" in f.message
