"""symmetric-units (GD126): the row comparison of the symmetry watcher (instrument/symmetry.py),
the watcher in a run, and the rule over hand-written traces."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.symmetry import CHECK_AT, symmetric_rows
from rule_traces import builder, findings, only

SLUG = "symmetric-units"


def _param(weight, grad):
    p = torch.nn.Parameter(weight)
    p.grad = grad
    return p


def test_equal_rows_with_equal_nonzero_gradient_rows_are_symmetric():
    row = torch.randn(1, 5)
    assert symmetric_rows(_param(row.repeat(4, 1), row.repeat(4, 1) * 0.3))
    # rows a blocked matmul computed apart: equal to the last bits
    assert symmetric_rows(_param(row.repeat(4, 1) * (1 + torch.tensor([[0.], [1e-7], [0.], [0.]])),
                                 row.repeat(4, 1)))


def test_rows_that_differ_or_a_zero_gradient_or_one_row_are_not():
    row = torch.randn(1, 5)
    assert not symmetric_rows(_param(torch.randn(4, 5), row.repeat(4, 1)))  # random init
    assert not symmetric_rows(_param(row.repeat(4, 1), torch.randn(4, 5)))  # gradients differ
    assert not symmetric_rows(_param(row.repeat(4, 1) * torch.tensor([[1.], [1.001], [1.], [1.]]),
                                     row.repeat(4, 1)))
    assert not symmetric_rows(_param(row.repeat(4, 1), torch.zeros(4, 5)))  # grads-always-zero's
    assert not symmetric_rows(_param(row.clone(), row.clone()))  # a single unit
    assert not symmetric_rows(_param(torch.ones(4), torch.ones(4)))  # a bias
    assert not symmetric_rows(_param(torch.ones(4, 1), torch.ones(4, 1)))  # one value per row
    assert not symmetric_rows(_param(row.repeat(4, 1), None))


def _train(init, steps=5, tail=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), tail or torch.nn.Linear(16, 2))
    for layer in (model[0], model[2]):
        if isinstance(layer, torch.nn.Linear):
            init(layer.weight)
            torch.nn.init.zeros_(layer.bias)  # random biases alone break the symmetry
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 6)).pow(2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_the_watcher_reports_a_constant_network_once_and_changes_nothing():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        checked = _train(lambda w: torch.nn.init.constant_(w, 0.1))
    assert checked == _train(lambda w: torch.nn.init.constant_(w, 0.1))
    (event,) = rec.trace.of_kind("symmetric_units")
    # both layers: the loss treats the two outputs alike, so they are copies too
    assert event["step"] == CHECK_AT and event["rows"] == [16, 2] and len(event["params"]) == 2


def test_the_watcher_is_silent_on_random_init_and_on_a_random_layer_after_a_constant_one():
    for init in (lambda w: None, None):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            if init is None:  # only the first layer constant: the second breaks the symmetry
                torch.manual_seed(0)
                _train(lambda w: torch.nn.init.constant_(w, 0.1) if w.shape[0] == 16 else None)
            else:
                _train(init)
        assert rec.trace.of_kind("symmetric_units") == []


def _trace(params=(0, 2), rows=(16, 2)):
    t = builder(params=[0, 1, 2, 3])
    for i in range(4):
        t.clear([0, 1, 2, 3], line=20)
        t.backward(fresh=[0, 1, 2, 3], line=21)
        t.step(line=22)
        if i == CHECK_AT - 1 and params:
            t.put(ev.symmetric_units(opt=0, params=list(params), rows=list(rows), step=CHECK_AT), 22)
    return t


def test_the_rule_reports_each_event_as_a_warning_naming_the_units():
    f = only(_trace(params=(0,), rows=(16,)), SLUG)
    assert f.severity is Severity.WARNING
    assert f.evidence == {"params": ["p0"], "after_updates": CHECK_AT}
    assert "the 16 units of p0" in f.message and "copies of each other" in f.message
    assert findings(_trace(params=()), SLUG) == []
