"""copies-stay-identical (GD167): the copy grouping of the symmetry watcher
(instrument/symmetry.py), the watcher in a run, and the rule over hand-written traces."""

from __future__ import annotations

import copy

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.symmetry import CHECK_AT, identical_copies
from rule_traces import builder, findings, only

SLUG = "copies-stay-identical"


def _param(weight, grad):
    p = torch.nn.Parameter(weight.clone())
    p.grad = None if grad is None else grad.clone()
    return p


def test_equal_tensors_with_equal_nonzero_gradients_are_grouped():
    w, g = torch.randn(4, 3), torch.randn(4, 3)
    params = {0: _param(w, g), 1: _param(torch.randn(4, 3), g), 2: _param(w, g), 3: _param(w, g)}
    assert identical_copies(params) == [[0, 2, 3]]


def test_differences_zero_gradients_tied_tensors_and_scalars_are_not_copies():
    w, g = torch.randn(4, 3), torch.randn(4, 3)
    assert identical_copies({0: _param(w, g), 1: _param(w, g * 1.0001)}) == []  # gradients differ
    near = w.clone()
    near[3, 2] += 1e-3  # one value away from the sampled ones
    assert identical_copies({0: _param(w, g), 1: _param(near, g)}) == []
    assert identical_copies({0: _param(w, torch.zeros(4, 3)), 1: _param(w, torch.zeros(4, 3))}) == []
    assert identical_copies({0: _param(w, None), 1: _param(w, None)}) == []
    one = _param(w, g)
    assert identical_copies({0: one, 1: one}) == []  # tied: one tensor under two ids
    assert identical_copies({0: _param(torch.ones(1), torch.ones(1)),
                             1: _param(torch.ones(1), torch.ones(1))}) == []


def _train(member_rows, copies=True, steps=5):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    members = torch.nn.ModuleList(
        [copy.deepcopy(base) if copies else torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)) for _ in range(3)])
    opt = torch.optim.SGD(members.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 6)
        opt.zero_grad()
        loss = sum(m(member_rows(x)).pow(2).mean() for m in members)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_the_watcher_reports_deepcopied_members_on_one_batch_and_changes_nothing():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        checked = _train(lambda x: x)
    assert checked == _train(lambda x: x)
    (event,) = rec.trace.of_kind("copies_identical")
    assert event["step"] == CHECK_AT
    assert sorted(len(g) for g in event["groups"]) == [3, 3, 3]  # 3 members each; the 1-value bias is not compared


def test_the_watcher_is_silent_on_own_rows_per_member_and_on_separate_constructions():
    for rows, copies in ((lambda x: x[torch.randint(0, len(x), (len(x),))], True),
                         (lambda x: x, False)):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            _train(rows, copies)
        assert rec.trace.of_kind("copies_identical") == []


def _trace(groups=((0, 2), (1, 3))):
    t = builder(params=[0, 1, 2, 3])
    for i in range(4):
        t.clear([0, 1, 2, 3], line=20)
        t.backward(fresh=[0, 1, 2, 3], line=21)
        t.step(line=22)
        if i == CHECK_AT - 1 and groups:
            t.put(ev.copies_identical(opt=0, groups=[list(g) for g in groups], step=CHECK_AT), 22)
    return t


def test_the_rule_reports_each_event_as_a_warning_naming_the_copies():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING
    assert f.evidence["after_updates"] == CHECK_AT
    assert "copies" in f.message and "never diverge" in f.message
    assert findings(_trace(groups=()), SLUG) == []


def test_biases_of_two_branches_summed_into_one_output_are_no_copies():
    class TwoBranches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
            for layer in (self.a, self.b):
                torch.nn.init.zeros_(layer.bias)  # one gradient for both: the output's

        def forward(self, x):
            return self.a(x) + self.b(x)

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = TwoBranches()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 6)).pow(2).mean().backward()
            opt.step()
    assert identical_copies({0: model.a.bias, 1: model.b.bias}) == [[0, 1]]  # equal vectors
    assert rec.trace.of_kind("copies_identical") == []  # but no weight matrix among them
