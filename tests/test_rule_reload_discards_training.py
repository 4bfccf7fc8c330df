"""reload-discards-training (GD258): hand-written traces of ``param_reset`` loads, and what the
reset watcher (instrument/resets.py) records of a state's values and of a trained state saved
before a reload."""

from __future__ import annotations

import copy

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.resets import fingerprint
from rule_traces import P, builder, findings, only

SLUG = "reload-discards-training"


def _loop(loads=(0, 3, 6), steps=8, state=lambda i: [0, [0, 0]], values=lambda i: 1.5,
          kept=lambda i: False, line=7):
    t = builder()
    for i in range(steps):
        t.backward(fresh=P, line=8)
        t.step(line=9)
        if i in loads:
            t.put(ev.param_reset(via="load_state_dict", params=[0, 1], state=state(i),
                                 values=values(i), kept=kept(i)), line=line)
    return t


def test_the_same_state_loaded_again_after_steps_is_a_warning_at_the_second_load():
    f = only(_loop(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert f.evidence["loads"] == 3 and f.evidence["steps_between"] == 3
    assert "every update since the previous load is discarded" in f.message


def test_silent_on_one_load_and_on_a_state_whose_values_change():
    assert findings(_loop(loads=(2,)), SLUG) == []
    assert findings(_loop(values=lambda i: float(i)), SLUG) == []  # Reptile, federated averaging


def test_the_values_decide_over_the_tensors_and_the_versions_without_them():
    # a fresh copy of the same values at each load: another state number, the same values
    assert only(_loop(state=lambda i: [i, [0, 0]]), SLUG)
    # past the fingerprinted loads: the very same tensors at the same versions
    assert only(_loop(values=lambda i: None), SLUG)
    assert findings(_loop(values=lambda i: None, state=lambda i: [0, [i, i]]), SLUG) == []


def test_silent_when_the_trained_values_were_saved_before_the_reload():
    assert findings(_loop(kept=lambda i: i > 0), SLUG) == []


def test_silent_when_the_optimizer_is_built_after_the_first_load():
    t = builder()
    t.put(ev.param_reset(via="load_state_dict", params=[0, 1], state=[0, [0, 0]], values=1.0,
                         kept=False), line=5)
    t.optimizer(1, P, line=6)
    for i in range(3):
        t.backward(fresh=P, line=8)
        t.step(1, line=9)
    t.put(ev.param_reset(via="load_state_dict", params=[0, 1], state=[0, [0, 0]], values=1.0,
                         kept=False), line=5)
    # optimizer 1 (built after the first load) is a new run: a sweep; optimizer 0 never stepped
    assert findings(t, SLUG) == []


def test_a_reload_between_every_two_steps_is_left_to_params_reset_every_step():
    t = builder()
    for i in range(6):
        t.put(ev.param_reset(via="load_state_dict", params=[0, 1], state=[0, [0, 0]], values=1.0,
                             kept=False), line=7)
        t.backward(fresh=P, line=8)
        t.step(line=9)
    assert findings(t, SLUG) == []
    assert findings(t, "params-reset-every-step")


def test_the_watcher_fingerprints_values_and_notes_a_saved_state():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(3, 2)
        frozen = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            if i == 1:
                saved = model.state_dict()  # the trained values kept before the reload
            model.load_state_dict(frozen.state_dict())
        with torch.no_grad():
            frozen.weight.data.add_(1.0)  # no version change, other values
        model.load_state_dict(frozen.state_dict())
    loads = [e for e in rec.trace.of_kind("param_reset")]
    assert [e["state"][0] for e in loads] == [0, 0, 0, 0]  # state_dict() detaches anew: one memory
    values = [e["values"] for e in loads]
    assert values[0] == values[1] == values[2] != values[3]
    assert [e["kept"] for e in loads] == [False, True, False, False]
    assert saved is not None


def test_the_fingerprint_reads_floating_tensors_only():
    assert fingerprint({"step": torch.tensor(3)}) is None
    a = {"w": torch.arange(200.0).reshape(20, 10)}
    b = {"w": torch.arange(200.0).reshape(20, 10).clone()}
    assert fingerprint(a) == fingerprint(b)
    b["w"][0, 3] += 1  # a sampled value (every third of the first 192)
    assert fingerprint(a) != fingerprint(b)
