"""params-reset-every-step (GD123): hand-written traces, and the ``param_reset`` events the
reset watcher (instrument/resets.py) records."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, findings, only

SLUG = "params-reset-every-step"


def _loop(via="torch.nn.init.xavier_uniform_", steps=4, every=1, states=None):
    t = builder()
    for i in range(steps):
        if i % every == 0:
            state = None if states is None else states(i)
            t.put(ev.param_reset(via=via, params=[0], state=state), line=7)
        t.backward(fresh=P, line=8)
        t.step(line=9)
    return t


def test_a_reset_between_every_two_steps_is_an_error_at_the_resetting_call():
    f = only(_loop(), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 7
    assert "xavier_uniform_" in f.message and f.evidence["steps"] == 4


def test_silent_on_an_occasional_reset_and_too_few_steps():
    assert findings(_loop(every=2), SLUG) == []
    assert findings(_loop(steps=2), SLUG) == []


def test_load_state_dict_counts_only_when_it_loads_the_same_unchanged_state():
    assert only(_loop(via="load_state_dict", states=lambda i: [0, [1, 1]]), SLUG)
    assert findings(_loop(via="load_state_dict", states=lambda i: [i, [1, 1]]), SLUG) == []
    assert findings(_loop(via="load_state_dict", states=lambda i: [0, [i, 1]]), SLUG) == []


def test_the_watcher_records_owned_parameters_set_back_after_the_first_step():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(3, 1)
        copy = torch.nn.Linear(3, 1)  # no optimizer owns it
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        torch.nn.init.zeros_(model.bias)  # before any step: construction, not recorded
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            torch.nn.init.zeros_(model.bias)
            torch.nn.init.zeros_(copy.bias)
            model.load_state_dict(saved)
    resets = [(e["via"], e["params"], e["state"]) for e in rec.trace.of_kind("param_reset")]
    bias = resets[0][1]
    assert resets == [("torch.nn.init.zeros_", bias, None),
                      ("load_state_dict", [0, 1], [0, [0, 0]]),
                      ("torch.nn.init.zeros_", bias, None),
                      ("load_state_dict", [0, 1], [0, [0, 0]])]
    assert torch.equal(model.weight.detach(), saved["weight"])  # the script's own calls ran
