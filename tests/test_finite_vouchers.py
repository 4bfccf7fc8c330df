"""The step's norm pass is skipped only where a watched op already saw every gradient finite.

``clip_grad_norm_`` (a finite total) and ``GradScaler.unscale_`` (when ``scaler.step`` then runs
the optimizer) vouch for the grads they saw; any change after that (a backward, an edit by
unwatched code) or a step outside ``scaler.step`` brings the norm pass back, so a NaN is still
caught. Norms are measured anyway on the first update and from the step budget's last one on.
"""

import math

import torch
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.topics import BUDGET_HOLD


def _events(rec, kind):
    return [e for e in rec.trace.events if e.kind == kind]


def _measured(rec):
    """Per step_begin: were the norms measured (True) or vouched for (False)?"""
    return [e["norm_pids"] is not None for e in _events(rec, "step_begin")]


def _setup(width=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randn(5, 3)


def _clipped_run(poison_at, before_clip: bool):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model, opt, x = _setup()
        for i in range(4):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            if i == poison_at and before_clip:
                model[0].weight.grad[0, 0] = float("nan")  # the total is NaN: no voucher
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if i == poison_at and not before_clip:
                model[2].bias.grad.mul_(float("inf"))  # edited after the clip, by unwatched code
            opt.step()
    return rec


def test_clip_grad_norm_vouches_for_the_grads_it_saw_finite():
    rec = _clipped_run(poison_at=None, before_clip=True)
    assert _measured(rec) == [True, False, False, False]
    begins = _events(rec, "step_begin")
    assert begins[1]["nonfinite"] == [] and begins[1]["norms"] is None


def test_a_nan_before_the_clip_is_measured_and_caught():
    rec = _clipped_run(poison_at=2, before_clip=True)
    assert _measured(rec)[:3] == [True, False, True]
    nonfinite = _events(rec, "step_begin")[2]["nonfinite"]
    assert len(nonfinite) == 4  # the NaN total spreads over every clipped grad


def test_an_edit_after_the_clip_is_measured_and_caught():
    rec = _clipped_run(poison_at=2, before_clip=False)
    assert _measured(rec)[:3] == [True, False, True]
    begin = _events(rec, "step_begin")[2]
    assert begin["nonfinite"] and all(not math.isfinite(n) for n in begin["norms"][-1:])
    assert _events(rec, "grad_edit")[0]["params"] == begin["nonfinite"]


def test_a_partial_clip_does_not_vouch_for_the_other_parameters():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model, opt, x = _setup()
        for _ in range(3):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)
            opt.step()
    assert _measured(rec) == [True, True, True]


def test_unscale_vouches_only_inside_scaler_step():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model, opt, x = _setup()
        scaler = torch.amp.GradScaler("cpu")
        for i in range(5):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).sum()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_value_(model.parameters(), 10.0)  # keeps finite grads finite
            if i < 3:
                scaler.step(opt)
            else:  # the user's own step after unscale_: nothing vouches for the grads
                opt.step()
            scaler.update()
    assert _measured(rec) == [True, False, False, True, True]


def test_a_nan_under_gradscaler_with_a_direct_step_is_caught():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model, opt, x = _setup()
        scaler = torch.amp.GradScaler("cpu")
        for i in range(3):
            opt.zero_grad()
            scaler.scale(model(x).pow(2).sum() * (float("nan") if i == 2 else 1.0)).backward()
            scaler.unscale_(opt)
            opt.step()  # bypasses the scaler's inf check
            scaler.update()
    begins = _events(rec, "step_begin")
    assert [bool(b["nonfinite"]) for b in begins] == [False, False, True]


def test_norms_come_back_for_the_last_updates_of_the_budget():
    rec = Recorder(step_budget=4)
    rec.subscribe(BUDGET_HOLD, lambda: rec.progress.steps < 6)  # like a DataLoader extending the replay
    with Instrumentation(rec):
        model, opt, x = _setup()
        for _ in range(6):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert _measured(rec) == [True, False, False, True, True, True]


def test_a_backward_drops_the_vouchers_of_the_grads_it_writes():
    """A voucher is keyed on (id(grad), version); a new grad allocated where a freed one lived,
    then clipped with a NaN total (an in-place multiply, no new voucher), could match the old
    voucher and skip the norm pass: the NaN step went unreported in about 1 run in 4."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model, opt, x = _setup()
        stale = []
        for i in range(3):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            pids = {rec.pid(p) for p in model.parameters()}
            stale.append(sorted(pids & set(rec.grads.finite)))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert stale == [[], [], []]
    assert _measured(rec) == [True, False, False]  # the vouchers of each update still work
