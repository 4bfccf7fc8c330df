"""lr-grows-unbounded (GD137) on hand-written traces: the lr each step read and what wrote it."""

from __future__ import annotations

import pytest

from graddoctor.findings import Severity
from rule_traces import fold_hard
from test_rule_lr_collapsed import _found as _collapse_found, _run

SLUG = "lr-grows-unbounded"


def _found(trace):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    return list(find_rule(SLUG)().check(Analysis(trace)))


def test_a_factor_above_one_per_step_runs_away():
    f = _found(_run([0.01 * 1.3 ** i for i in range(12)], cls="ExponentialLR", start=0.01))
    assert len(f) == 1 and f[0].severity is Severity.WARNING and f[0].location.line == 3
    assert "rose at every step" in f[0].message and "gamma below 1" in f[0].fix
    assert _collapse_found(_run([0.01 * 1.3 ** i for i in range(12)], cls="ExponentialLR", start=0.01)) == []


def test_a_warm_up_without_its_cap_is_info():
    lrs = [0.01 * (i + 1) / 4 for i in range(12)]  # 3x the lr by the 12th step, still rising
    f = _found(_run(lrs, cls="LambdaLR", start=0.01))[0]
    assert f.severity is Severity.INFO and "min(1.0" in f.fix


@pytest.mark.parametrize("case", [
    dict(lrs=[0.01 * 1.3 ** i for i in range(12)], cls="ExponentialLR", start=0.01, status="completed"),
    dict(lrs=[0.01 * 1.3 ** i for i in range(12)], cls="OneCycleLR", start=0.01),
    dict(lrs=[0.01 * 1.3 ** i for i in range(12)], cls="LinearLR", start=0.01),  # end_factor caps it
    dict(lrs=[0.08 * min(1, (i + 1) / 4) for i in range(12)], cls="LambdaLR", start=0.01),  # holds at 8x
    dict(lrs=[0.01 * 1.1 ** i for i in range(6)], cls="ExponentialLR", start=0.01),  # under 2x
    dict(lrs=[1e-7 * 1.5 ** i for i in range(30)], cls="ExponentialLR", start=1e-7),  # a range test
    dict(lrs=[0.01, 0.02, 0.05, 0.04, 0.08, 0.1], cls="LambdaLR", start=0.01),  # fell once: a cycle
])
def test_silent(case):
    assert _found(_run(**case)) == []


def test_folding_keeps_the_finding():
    trace = _run([0.01 * 1.3 ** i for i in range(14)], cls="ExponentialLR", start=0.01)
    assert [f.message for f in _found(fold_hard(trace))] == [f.message for f in _found(trace)]


def _two_groups(lrs, start=3e-3):
    """An optimizer built from two param groups (torch's constructor adds each in turn: one
    ``optimizer_init`` event per group), both at lr ``start``; the script writes ``lrs`` into
    every group by hand before each step (nanoGPT's warm-up)."""
    from graddoctor import events as ev
    from graddoctor.trace import TraceBuilder
    from lr_traces import P
    t = TraceBuilder()
    t._params(P)
    half = len(P) // 2
    t.put(ev.optimizer_init(opt=0, cls="AdamW", params=list(P[:half]), lrs=[start]), 2)
    t.put(ev.optimizer_init(opt=0, cls="AdamW", params=list(P[half:]), lrs=[start]), 2)
    for lr in lrs:
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr, lr]), 12)
        t.step(0, line=12)
    t.put(ev.run_end(status="step-limit", steps=len(lrs)))
    return t.trace


def test_a_second_groups_constructed_lr_caps_its_warm_up():
    # a warm-up towards the constructed lr, still climbing when the budget stops the script: the
    # second group's constructed lr is the ceiling as much as the first's
    assert _found(_two_groups([3e-3 * (i + 1) / 21 for i in range(10)])) == []


def test_a_second_group_rising_past_its_constructed_lr_is_still_found():
    f = _found(_two_groups([3e-3 * (i + 1) for i in range(12)]))
    assert len(f) == 1 and f[0].severity is Severity.WARNING


def test_a_lambda_with_a_ceiling_in_its_text_is_capped(tmp_path):
    from graddoctor.analysis.source import factor_capped
    path = tmp_path / "train.py"
    path.write_text(
        "import math, torch\n"
        "def piecewise(s):\n"
        "    if s < 20:\n"
        "        return 4 * (s + 1) / 20\n"
        "    return 2 * (1 + math.cos(s))\n"
        "def ramp(s):\n"
        "    return (s + 1) / 20\n"
        "a = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min((u + 1) / 20, (20 / (u + 1)) ** 0.5) * 5)\n"
        "b = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: world * min(1.0, (s + 1) / 20))\n"
        "c = torch.optim.lr_scheduler.LambdaLR(opt, piecewise)\n"
        "d = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 20)\n"
        "e = torch.optim.lr_scheduler.LambdaLR(opt, ramp)\n"
        "f = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min([(s + 1) / 20]) * 8)\n"
        "g = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: np.clip(s / 20, 0, 4))\n"
        "h = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 20 if s < 20 else 1.0)\n")
    capped = {line: factor_capped(str(path), line, "LambdaLR") for line in range(8, 16)}
    assert capped == {8: True, 9: True, 10: True, 11: False, 12: False, 13: False, 14: True, 15: True}


def test_a_written_lr_with_a_ceiling_in_its_text_is_capped(tmp_path):
    from graddoctor.analysis.source import written_lr_capped
    path = tmp_path / "train.py"
    path.write_text(
        "def triangular(step):\n"
        "    pos = step % 400\n"
        "    return lo + (hi - lo) * (pos / 200 if pos < 200 else 2 - pos / 200)\n"
        "def ramp(step):\n"
        "    return lo * (1 + step / 10)\n"
        "for step in range(100):\n"
        "    for g in opt.param_groups:\n"
        "        g['lr'] = triangular(step)\n"
        "        g['lr'] = ramp(step)\n"
        "        g['lr'] = lo * min(8, 1 + step / 10)\n"
        "        g['lr'] = lo * (1 + step / 10)\n")
    capped = {line: written_lr_capped(str(path), line) for line in range(8, 12)}
    assert capped == {8: True, 9: False, 10: True, 11: False}


def test_a_decay_that_turns_into_a_climb_past_its_start_is_a_warning():
    lrs = [0.01 * (1 - 0.005 * i) for i in range(4)] + [0.01 * (i + 1) / 4 for i in range(4, 14)]
    f = _found(_run(lrs, cls="LambdaLR", start=0.01))
    assert len(f) == 1 and f[0].severity is Severity.WARNING
    assert "fell after the first step, then climbed" in f[0].message and f[0].evidence["turned"]
    assert [x.message for x in _found(fold_hard(_run(lrs, cls="LambdaLR", start=0.01)))] == [f[0].message]


@pytest.mark.parametrize("lrs", [
    [0.01, 0.009, 0.008, 0.009, 0.01, 0.0195],  # back to under 2x its start
    [0.01, 0.012, 0.011, 0.02, 0.03, 0.04],  # rose before it fell: a cycle, then a climb
    [0.01, 0.009, 0.03, 0.02, 0.04, 0.05],  # fell twice: a cycle
])
def test_a_turn_that_is_a_cycle_or_stays_near_its_start_is_silent(lrs):
    assert _found(_run(lrs, cls="LambdaLR", start=0.01)) == []


def test_the_branch_of_a_lambda_def_is_found(tmp_path):
    from graddoctor.analysis.source import factor_branch_line
    script = tmp_path / "s.py"
    script.write_text("def schedule(step):\n"                    # 1
                      "    if step > warmup:\n"                  # 2
                      "        return (step + 1) / warmup\n"      # 3
                      "    return 1 - step / total\n"             # 4
                      "sched = LambdaLR(opt, schedule)\n"         # 5
                      "other = LambdaLR(opt, lambda s: s if s < 3 else 1)\n")  # 6
    assert factor_branch_line(str(script), 5, "LambdaLR") == 2
    assert factor_branch_line(str(script), 6, "LambdaLR") is None  # inline: the call's own line


def _climb_then(after_opt_steps: int, interleaved: bool = False):
    """opt 0's lr climbs 4x per step, written by the script (a manual lr range test); then
    opt 1 (the training optimizer) takes ``after_opt_steps`` steps at a fixed lr. ``interleaved``:
    opt 1 also steps inside the climb (two optimizers trained together)."""
    from graddoctor import events as ev
    from graddoctor.trace import TraceBuilder
    from lr_traces import P
    t = TraceBuilder()
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=list(P), lrs=[1e-4]), 2)
    if interleaved:
        t.put(ev.optimizer_init(opt=1, cls="SGD", params=list(P), lrs=[0.1]), 3)
    for i in range(8):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[1e-4 * 4 ** i]), 12)
        t.step(0, line=12)
        if interleaved:
            t.put(ev.step_begin(opt=1, norm_pids=None, norms=None, lrs=[0.1]), 13)
            t.step(1, line=13)
    if not interleaved:
        t.put(ev.optimizer_init(opt=1, cls="SGD", params=list(P), lrs=[0.1]), 20)
    for _ in range(after_opt_steps):
        t.clear(P, line=21)
        t.backward(fresh=P, line=22)
        t.put(ev.step_begin(opt=1, norm_pids=None, norms=None, lrs=[0.1]), 23)
        t.step(1, line=23)
    t.put(ev.run_end(status="step-limit", steps=8 + after_opt_steps))
    return t.trace


def test_a_climb_handed_over_to_a_fresh_optimizer_is_a_range_test():
    # the climbing optimizer stopped after its 8 steps and training went on with another one
    assert _found(_climb_then(4)) == []


def test_a_climb_beside_another_optimizer_is_still_found():
    assert len(_found(_climb_then(0))) == 1  # the run stopped while it still climbed
    assert len(_found(_climb_then(0, interleaved=True))) == 1  # two optimizers stepped together
