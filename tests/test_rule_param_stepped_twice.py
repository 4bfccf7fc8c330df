"""param-stepped-twice (GD308): one optimizer owning the same memory twice (a parameter listed
twice, two Parameters over one storage), on hand-written traces (the rule) and on optimizers
built under the instrumentation (the construction-time check that records ``aliases``)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "param-stepped-twice"


def trace(aliases, fresh=(0, 1, 2), stepped=True, without=(), path="train.py"):
    t = TraceBuilder(path=path)
    t.param(0, "model.emb.weight")
    t.param(1, "model.body.weight")
    t.param(2, "model.out.weight")
    t.put(ev.optimizer_init(opt=0, cls="Adam", params=[0, 1, 2], aliases=[list(a) for a in aliases]), 12)
    for _ in range(3):
        t.clear([0, 1, 2], line=15)
        t.backward(fresh=list(fresh), line=16)
        if stepped:
            t.step(0, line=17, without_grad=list(without))
    return t


def test_two_parameters_over_one_storage_are_a_warning_at_the_optimizer_without_source():
    f = only(trace([(0, 2)]), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 12
    assert "model.out.weight and model.emb.weight are two Parameters" in f.message
    assert "`self.out.weight = self.emb.weight`" in f.fix
    assert f.evidence["cause"] == "shared_storage"


def test_a_parameter_listed_twice_says_so():
    f = only(trace([(1, 1)]), SLUG)
    assert "model.body.weight is listed twice" in f.message and f.location.line == 12
    assert f.evidence["cause"] == "listed_twice" and "once" in f.fix


def test_silent_when_the_shared_entries_never_train():
    assert findings(trace([(0, 2)], stepped=False), SLUG) == []
    assert findings(trace([(0, 2)], fresh=(0, 1)), SLUG) == []  # one side frozen: never stepped
    assert findings(trace([(0, 2)], without=(2,)), SLUG) == []
    assert findings(trace([]), SLUG) == []


def test_the_tying_line_is_found_in_the_source(tmp_path):
    script = tmp_path / "train.py"
    lines = ["import torch", "from torch import nn", "", "", "class LM(nn.Module):",
             "    def __init__(self):", "        super().__init__()",
             "        self.emb = nn.Embedding(4, 2)", "        self.out = nn.Linear(2, 4)",
             "        self.body = nn.Linear(2, 2)",
             "        self.out.weight = nn.Parameter(self.emb.weight)",
             "opt = torch.optim.Adam(LM().parameters())"]
    script.write_text("\n".join(lines) + "\n")
    f = only(trace([(0, 2)], path=str(script)), SLUG)
    assert f.location.line == 11 and [r.location.line for r in f.related] == [12]
    assert "`self.out.weight = self.emb.weight`" in f.fix


def test_a_tying_line_through_data_is_found_too(tmp_path):
    script = tmp_path / "tied.py"
    script.write_text("import torch\n" * 10 + "dec.weight.data = enc.weight.data\n"
                      + "opt = torch.optim.SGD([enc.weight, dec.weight], lr=0.1)\n")
    t = TraceBuilder(path=str(script))
    t.param(0, "enc.weight")
    t.param(1, "dec.weight")
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=[0, 1], aliases=[[0, 1]]), 12)
    for _ in range(2):
        t.backward(fresh=[0, 1], line=16)
        t.step(0, line=17)
    f = only(t, SLUG)
    assert f.location.line == 11 and "`dec.weight = enc.weight`" in f.fix


def _aliases(build):
    """The ``aliases`` of the optimizer_init events recorded while ``build()`` makes
    optimizers under the instrumentation (no script run)."""
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build()
    return [e.get("aliases") for e in rec.trace if e.kind == "optimizer_init"]


def test_construction_records_shared_storage_and_repeats_only():
    emb, out = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    out.weight = nn.Parameter(emb.weight)
    tied_a, tied_b = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    tied_b.weight = tied_a.weight
    flat = nn.Linear(4, 4)
    buffer = torch.zeros(20)
    flat.weight.data, flat.bias.data = buffer[:16].view(4, 4), buffer[16:]
    copy = nn.Linear(3, 5, bias=False)
    copy.weight = nn.Parameter(emb.weight.detach().clone())
    found = _aliases(lambda: (
        torch.optim.SGD([emb.weight, out.weight], lr=0.1),
        torch.optim.SGD(list(tied_a.parameters()) + list(tied_b.parameters()), lr=0.1),
        torch.optim.SGD([*tied_a.parameters(), *copy.parameters(), *flat.parameters()], lr=0.1),
        torch.optim.SGD([{"params": [emb.weight]}, {"params": [out.weight], "lr": 0.01}], lr=0.1),
    ))
    assert [None if a is None else len(a) for a in found] == [1, 1, None, None, 1]
    first, second = found[0][0], found[1][0]
    assert first[0] != first[1] and second[0] == second[1]  # two objects; one object twice


def test_construction_skips_empty_and_meta_parameters():
    found = _aliases(lambda: torch.optim.SGD(
        [nn.Parameter(torch.empty(0)), nn.Parameter(torch.empty(0)),
         nn.Parameter(torch.empty(3, device="meta")), nn.Parameter(torch.empty(3, device="meta"))],
        lr=0.1))
    assert found == [None]
