"""A skimmed ``loss.backward()`` runs torch's ``torch.autograd.backward(loss)`` itself, as
torch's ``Tensor.backward`` would (``BackwardWatcher._skim_backward``: two Python frames fewer per
skimmed turn). It may only when nothing would have seen the two frames it leaves out: a
``__torch_function__`` mode or tensor subclass sees ``Tensor.backward`` on every turn, and a
``torch.autograd.backward`` replaced after the hooks were armed is the one called; the counts are
those of the run without the skim."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from graddoctor.instrument import Instrumentation, fold
from graddoctor.instrument.backward import BackwardWatcher
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

TURNS = 120


def _skim_constants(monkeypatch) -> None:  # as tests/test_steady_hooks.py: skimmed from turn ~20
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3)
    monkeypatch.setattr(fold, "SKIM_AFTER", 6)
    monkeypatch.setattr(fold, "SKIM_EVERY", 4)


def _counting_skims(monkeypatch) -> list[int]:
    skims = [0]
    original = BackwardWatcher._skim_backward

    def counting(self, *args):
        skims[0] += 1
        return original(self, *args)

    monkeypatch.setattr(BackwardWatcher, "_skim_backward", counting)
    return skims


def _loop(turns: int, at_turn=None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    for i in range(turns):
        if at_turn is not None:
            at_turn(i)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_skimmed_backwards_are_counted_and_traced_as_without_the_skim(monkeypatch):
    _skim_constants(monkeypatch)
    skims = _counting_skims(monkeypatch)
    runs = {}
    for skim in (True, False):
        monkeypatch.setattr(fold, "SKIM", skim)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec):
            _loop(TURNS)
        runs[skim] = (rec.progress.backward_calls, rec.progress.steps, rec.running_backwards,
                      rec.trace.next_seq)
    assert skims[0] > TURNS // 2  # the direct path ran
    assert runs[True][0] == runs[False][0] == TURNS and runs[True][1] == TURNS
    assert runs[True] == runs[False]  # no backward left marked running, the same seqs


class _SeesBackward(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.backwards = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.backward:
            self.backwards += 1
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_every_skimmed_backward(monkeypatch):
    _skim_constants(monkeypatch)
    skims = _counting_skims(monkeypatch)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        mode = _SeesBackward()
        with mode:
            _loop(TURNS)
    assert skims[0] > TURNS // 2
    assert mode.backwards == TURNS


def test_a_torch_autograd_backward_replaced_after_arming_is_called_on_skimmed_turns(monkeypatch):
    _skim_constants(monkeypatch)
    skims = _counting_skims(monkeypatch)
    called = [0]
    installed = []

    def replace(i):
        if i == 60:
            wrapper = torch.autograd.backward  # graddoctor's

            def logged_backward(*args, **kwargs):
                called[0] += 1
                return wrapper(*args, **kwargs)

            installed.append(wrapper)
            torch.autograd.backward = logged_backward

    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        try:
            _loop(TURNS, replace)
        finally:
            if installed:
                torch.autograd.backward = installed[0]  # before graddoctor puts torch's back
    assert skims[0] > TURNS // 2
    assert called[0] == TURNS - 60
    assert rec.progress.backward_calls == TURNS
