"""The straight-line hooks of a steady turn (``Folder.steady_take``; the zero_grad wrapper, the
backward wrapper, the optimizer step's pre and post hooks) record what their full paths record:
long in-process loops with deviations injected at random turns (a NaN gradient, ``p.grad /= 2``,
a parameter changed by hand, an lr change, a skipped zero_grad, a second backward, another call
site, ...) give the same trace, event for event, with and without them."""

from __future__ import annotations

import random

import pytest
import torch

from graddoctor.instrument import Instrumentation, fold
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

DEVIATIONS = ("nan", "grad_div", "param_edit", "lr", "skip_zero_grad", "second_backward",
              "other_site", "helper_site", "keep_grads", "frozen", "clip", "no_step", "snapshot",
              "new_param", "retain", "grad_none", "closure")


def _other_site(opt):
    opt.zero_grad()  # a zero_grad called from a helper: another call site and a caller


def _loop(rec: Recorder, plan: dict[int, str], turns: int, seed: int) -> None:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    params = list(model.parameters())
    for i in range(turns):
        what = plan.get(i)
        if what == "other_site":
            opt.zero_grad()
        elif what == "helper_site":
            _other_site(opt)
        elif what == "keep_grads":
            opt.zero_grad(set_to_none=False)
        elif what != "skip_zero_grad":
            opt.zero_grad()
        if what == "frozen":
            params[0].requires_grad_(False)
        xb = x
        if what == "nan":
            xb = x.clone()
            xb[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(xb), y)
        if what == "retain":
            loss.backward(retain_graph=True)
        else:
            loss.backward()
        if what == "second_backward":
            torch.nn.functional.mse_loss(model(x), y).backward()
        if what == "grad_div":
            params[1].grad /= 2
        if what == "grad_none":
            params[2].grad = None
        if what == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if what == "lr":
            opt.param_groups[0]["lr"] = 0.01 * (1 + i % 3)
        if what == "param_edit":
            with torch.no_grad():
                params[2].mul_(0.999)
        if what == "snapshot":
            rec.snapshot()
        if what == "new_param":
            extra = torch.nn.Parameter(torch.zeros(2))
            opt.add_param_group({"params": [extra]})
        if what == "closure":
            opt.step(lambda: None)
        elif what != "no_step":
            opt.step()
        if what == "frozen":
            params[0].requires_grad_(True)
        if what == "nan":  # back to finite weights (itself a change by hand)
            torch.manual_seed(seed + i)
            with torch.no_grad():
                for p in params:
                    p.copy_(torch.randn_like(p) * 0.1)


def _trace(plan: dict[int, str], turns: int, seed: int, hooks: bool, grad_flow: bool,
           monkeypatch) -> tuple[str, int]:
    monkeypatch.setattr(fold, "STEADY_HOOKS", hooks)
    taken = [0]
    original = fold.Folder.steady_take

    def counting(self, *args):
        ok = original(self, *args)
        taken[0] += ok
        return ok

    monkeypatch.setattr(fold.Folder, "steady_take", counting)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec, grad_flow=grad_flow):
        _loop(rec, plan, turns, seed)
    return rec.trace.dumps(), taken[0]


@pytest.mark.parametrize("seed", range(8))
def test_steady_hooks_record_what_the_full_paths_record(seed, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3 + seed % 3)
    rng = random.Random(seed)
    turns = 400
    plan = {}
    for i in sorted(rng.sample(range(20, turns), 14)):
        plan[i] = rng.choice(DEVIATIONS)
    grad_flow = seed % 2 == 1
    with_hooks, taken = _trace(plan, turns, seed, True, grad_flow, monkeypatch)
    without, none = _trace(plan, turns, seed, False, grad_flow, monkeypatch)
    assert none == 0
    assert taken > 100  # the straight-line paths ran (a param without grads stops two of them)
    assert with_hooks.splitlines() == without.splitlines()


@pytest.mark.parametrize("what", DEVIATIONS)
def test_each_deviation_is_recorded_in_full(what, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3)
    plan = {60: what, 61: what, 90: what}
    with_hooks, taken = _trace(plan, 140, 1, True, False, monkeypatch)
    without, _ = _trace(plan, 140, 1, False, False, monkeypatch)
    assert taken > 100
    assert with_hooks.splitlines() == without.splitlines()


def _loader_loop(rec: Recorder, plan: dict[int, str]) -> None:
    torch.manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(480, 4), torch.randn(480, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    i = 0
    for _epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if plan.get(i) == "grad_div":
                model[0].weight.grad /= 2
            opt.step()
            i += 1
        scheduler.step()


@pytest.mark.parametrize("hooks_first", [True, False])
def test_a_loader_loop_records_the_same_with_the_straight_line_paths(hooks_first, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 5)
    plan = {70: "grad_div", 200: "grad_div"}
    traces = {}
    for hooks in (hooks_first, not hooks_first):
        monkeypatch.setattr(fold, "STEADY_HOOKS", hooks)
        taken = [0]
        original = fold.Folder.steady_take

        def counting(self, *args, original=original, taken=taken):
            ok = original(self, *args)
            taken[0] += ok
            return ok

        monkeypatch.setattr(fold.Folder, "steady_take", counting)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec, epoch_batches=0):
            _loader_loop(rec, plan)
        traces[hooks] = (rec.trace.dumps(), taken[0])
        monkeypatch.setattr(fold.Folder, "steady_take", original)
    assert traces[False][1] == 0
    assert traces[True][1] > 1000  # the backward's too (912 without), its next batch each turn
    assert traces[True][0].splitlines() == traces[False][0].splitlines()
