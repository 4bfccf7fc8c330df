"""The steady state of a long run with a model whose forwards the mode watcher holds back
(``mode_forward`` of its Dropout and BatchNorm layers: ``Recorder.hold``): the held events and
the event that releases them go onto the steady path together (``Folder.steady_accepts``,
``Recorder.put_held``), so such a model's turns take the straight-line hooks and the skim as a
plain MLP's do, and the trace is the one recorded without any steady state, event for event
(deviations injected: a mode switched, an evaluation forward, a forward without a backward, a
snapshot, a second backward)."""

from __future__ import annotations

import pytest
import torch

from graddoctor.instrument import Instrumentation, fold
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

DEVIATIONS = ("eval_forward", "train_call", "extra_forward", "snapshot", "second_backward",
              "no_grad_forward")


def _loop(rec: Recorder, plan: dict[int, str], turns: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    for i in range(turns):
        what = plan.get(i)
        opt.zero_grad()
        if what == "eval_forward":
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()
        if what == "train_call":
            model.train()
        if what == "no_grad_forward":
            with torch.no_grad():
                model(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if what == "extra_forward":
            model(x)
        loss.backward()
        if what == "second_backward":
            torch.nn.functional.mse_loss(model(x), y).backward()
        if what == "snapshot":
            rec.snapshot()
        opt.step()


def _run(plan: dict[int, str], turns: int, steady: bool, skim: bool, monkeypatch):
    from graddoctor.rules.engine import analyze

    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3 if steady else 10 ** 9)
    monkeypatch.setattr(fold, "SKIM_AFTER", 6)
    monkeypatch.setattr(fold, "SKIM_EVERY", 4)
    monkeypatch.setattr(fold, "SKIM", skim)
    taken = [0]
    original = fold.Folder.steady_take

    def counting(self, *args):
        ok = original(self, *args)
        taken[0] += ok
        return ok

    monkeypatch.setattr(fold.Folder, "steady_take", counting)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        _loop(rec, plan, turns)
    monkeypatch.setattr(fold.Folder, "steady_take", original)
    findings, errors = analyze(rec.trace)
    assert not errors
    assert rec.internal_errors == 0
    return rec.trace.dumps().splitlines(), [(f.rule, f.message, f.location, f.step) for f in findings], taken[0]


def test_a_model_with_held_forwards_reaches_the_steady_path_and_records_the_same(monkeypatch):
    trace, findings, taken = _run({}, 200, True, False, monkeypatch)
    plain, plain_findings, none = _run({}, 200, False, False, monkeypatch)
    assert none == 0
    assert taken > 300  # zero_grad and the step's hooks of most turns (the forward is held)
    assert trace == plain and findings == plain_findings


@pytest.mark.parametrize("what", DEVIATIONS)
def test_a_deviation_around_held_forwards_is_recorded_in_full(what, monkeypatch):
    plan = {60: what, 61: what, 97: what}
    trace, findings, taken = _run(plan, 140, True, False, monkeypatch)
    plain, plain_findings, _ = _run(plan, 140, False, False, monkeypatch)
    assert taken > 100
    assert trace == plain and findings == plain_findings


def test_the_skim_of_a_model_with_held_forwards_changes_no_finding(monkeypatch):
    from graddoctor.instrument.optim import OptimizerWatcher

    skimmed = [0]
    original = OptimizerWatcher._skim_begin

    def noting(self, *args):
        skimmed[0] += 1
        return original(self, *args)

    monkeypatch.setattr(OptimizerWatcher, "_skim_begin", noting)
    _, findings, _ = _run({80: "eval_forward"}, 300, True, True, monkeypatch)
    monkeypatch.setattr(OptimizerWatcher, "_skim_begin", original)
    _, plain, _ = _run({80: "eval_forward"}, 300, False, False, monkeypatch)
    assert skimmed[0] > 150
    assert findings == plain
