"""Update shapes and per-layer gradient norms from hand-written traces (no torch)."""

from __future__ import annotations

import math

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.report.gradflow import bar_fraction, layer_of, log_span
from graddoctor.report.timeline import label_of, shapes, step_ranges, updates
from graddoctor.trace import Location, TraceBuilder


def shape_strings(trace) -> list[tuple[int, str, str]]:
    out = []
    for s in shapes(Analysis(trace)):
        text = " → ".join(i.plain("train.py") for i in s.items)
        out.append((s.updates, step_ranges(s.steps), text))
    return out


def step(t, line, opt=0):
    t.event("step_begin", line=line, opt=opt, closure=False, norm_pids=[], norms=[], nonfinite=[])
    t.step(opt, line=line)


def test_zero_grad_at_the_top_opens_each_update():
    t = TraceBuilder()
    for _ in range(3):
        t.clear([0], line=10)
        t.backward(fresh=[0], line=12)
        step(t, 13)
    assert shape_strings(t.trace) == [(3, "1–3", "zero_grad L10 → backward L12 → step L13")]


def test_zero_grad_after_the_step_closes_the_update():
    t = TraceBuilder()
    for _ in range(3):
        t.backward(fresh=[0], line=12)
        step(t, 13)
        t.clear([0], line=14)
    assert shape_strings(t.trace) == [(3, "1–3", "backward L12 → step L13 → zero_grad L14")]


def test_accumulation_collapses_repeated_backward_calls():
    t = TraceBuilder()
    for _ in range(2):
        for _ in range(4):
            t.backward(fresh=[0], line=22)
        step(t, 24)
        t.clear([0], line=25)
    assert shape_strings(t.trace) == [(2, "1–2", "backward L22 ×4 → step L24 → zero_grad L25")]


def test_a_repeated_block_is_folded():
    t = TraceBuilder()
    for _ in range(2):
        for _ in range(4):
            t.clear([0], line=13)
            t.backward(fresh=[0], line=15)
        step(t, 17)
    assert shape_strings(t.trace) == [(2, "1–2", "(zero_grad L13 → backward L15) ×4 → step L17")]


def test_block_folding_is_greedy_left_to_right():
    t = TraceBuilder()
    for line in (1, 2, 1, 2, 3, 1, 2, 3, 1, 2, 3):
        t.event("custom", line=line)
    step(t, 9)
    (_, _, text), = shape_strings(t.trace)
    assert text == "(custom L1 → custom L2) ×2 → (custom L3 → custom L1 → custom L2) ×2 → custom L3 → step L9"


def test_gan_two_steps_in_one_loop_body_are_one_update():
    t = TraceBuilder()
    for _ in range(2):
        t.clear([0], line=10, opt=0)
        t.backward(fresh=[0], line=12)
        step(t, 13, opt=0)
        t.clear([1], line=15, opt=1)
        t.backward(fresh=[1], line=17)
        step(t, 18, opt=1)
    (count, steps, text), = shape_strings(t.trace)
    assert count == 2 and steps == "1–4"
    assert text == "zero_grad L10 → backward L12 → step L13 → zero_grad L15 → backward L17 → step L18"


def test_helper_in_another_file_splits_on_repeats():
    t = TraceBuilder("train.py")
    for _ in range(2):
        t.trace.put(ev.backward(fresh=[0], accumulated=[], cleared_outside=[]), Location("lib.py", 5))
        step(t, 20)
    assert len(updates(Analysis(t.trace))) == 2


def test_scaler_step_absorbs_the_optimizer_step_and_backward_absorbs_scale():
    t = TraceBuilder()
    for _ in range(2):
        t.clear([0], line=10)
        t.event("scale", line=12)
        t.backward(fresh=[0], line=12, scaled=True)
        t.event("unscale", line=13)
        t.event("clip", line=14)
        t.event("step_begin", line=15, opt=0, closure=False, norm_pids=[], norms=[], nonfinite=[])
        t.step(0, line=15)
        t.event("scaler_step", line=15)
        t.event("scaler_update", line=16)
    assert shape_strings(t.trace) == [
        (2, "1–2", "zero_grad L10 → backward L12 → unscale L13 → clip L14 → scaler.step L15 → "
                   "scaler.update L16")]


def test_a_skipped_scaler_step_still_ends_its_update():
    t = TraceBuilder()
    t.clear([0], line=10)
    t.backward(fresh=[0], line=12)
    t.event("scaler_step", line=15)  # inf gradients: the optimizer step was skipped
    t.clear([0], line=10)
    t.backward(fresh=[0], line=12)
    t.event("scaler_step", line=15)
    assert [u.steps for u in updates(Analysis(t.trace))] == [[], []]


def test_kinds_unknown_today_get_their_own_name_and_forwards_are_skipped():
    t = TraceBuilder()
    t.event("bn_forward", line=11)
    t.event("module_forward", line=11)
    t.backward(fresh=[0], line=12)
    step(t, 13)
    t.event("ema_update", line=14)
    t.event("param", line=15)
    assert shape_strings(t.trace) == [(1, "1", "backward L12 → step L13 → ema_update L14")]
    assert label_of(t.trace.events[0]) is None


def test_validation_and_scheduler_at_epoch_end_make_their_own_shape():
    t = TraceBuilder()
    for epoch in range(2):
        t.event("train", line=18)
        t.event("epoch_start", line=19)
        for _ in range(3):
            t.clear([0], line=20)
            t.backward(fresh=[0], line=22)
            step(t, 23)
        t.event("scheduler_step", line=25)
        t.event("eval", line=27)
    assert shape_strings(t.trace) == [
        (2, "1, 4", "train() L18 → epoch L19 → zero_grad L20 → backward L22 → step L23"),
        (2, "2, 5", "zero_grad L20 → backward L22 → step L23"),
        (2, "3, 6", "zero_grad L20 → backward L22 → step L23 → sched.step L25 → eval() L27"),
    ]


def test_a_tail_without_a_step_is_not_an_update():
    t = TraceBuilder()
    t.backward(fresh=[0], line=12)
    step(t, 13)
    t.clear([0], line=10)
    t.backward(fresh=[0], line=12)  # stopped by the step budget before its step
    assert len(updates(Analysis(t.trace))) == 1
    assert shapes(Analysis(TraceBuilder().trace)) == []


@pytest.mark.parametrize("steps, text", [([], ""), ([3], "3"), ([1, 2, 3, 5, 7, 8], "1–3, 5, 7–8"),
                                         ([2, 1, 2], "1–2")])
def test_step_ranges(steps, text):
    assert step_ranges(steps) == text


# -- gradient flow -------------------------------------------------------------------------

def norms_trace():
    t = TraceBuilder()
    for pid, name in enumerate(["enc.0.weight", "enc.0.bias", "head.weight", "scale"]):
        t.param(pid, name)
    for norms in ([1.0, 1.0, 2.0], [3.0, 4.0, float("nan")]):
        t.event("step_begin", line=5, opt=0, closure=False, norm_pids=[0, 1, 2], norms=norms,
                nonfinite=[])
        t.event("step", line=5, opt=0, closure=False, skipped=False, without_grad=[3])
    return t.trace


def test_last_update_per_layer_norms():
    (update,) = Analysis(norms_trace()).last_update_norms
    assert update.step == 2
    layers = {layer.layer: layer for layer in update.layers}
    assert list(layers) == ["enc.0", "head", "scale"]
    assert layers["enc.0"].norm == pytest.approx(5.0) and layers["enc.0"].params == 2
    assert math.isnan(layers["head"].norm)
    assert layers["scale"].norm is None and layers["scale"].without_grad == 1


def test_closure_steps_and_no_steps_give_no_view():
    t = TraceBuilder()
    t.event("step_begin", line=5, opt=0, closure=True, norm_pids=[], norms=[], nonfinite=[])
    t.step(0, line=5, closure=True)
    assert Analysis(t.trace).last_update_norms == []


def test_log_scale():
    top, decades = log_span([1.0, 1e-2, None, float("nan"), 0.0])
    assert (top, decades) == (1.0, 4.0)
    assert bar_fraction(1.0, top, decades) == 1.0
    assert bar_fraction(1e-2, top, decades) == pytest.approx(0.5)
    assert bar_fraction(0.0, top, decades) == 0.0 and bar_fraction(None, top, decades) == 0.0
    top, decades = log_span([1.0, 1e-8])  # vanishing layers widen the scale so they stay visible
    assert decades == 9.0 and bar_fraction(1e-8, top, decades) > 0
    assert layer_of("model.fc1.weight") == "model.fc1" and layer_of("w") == "w"


def test_one_optimizer_per_parameter_stepped_inside_the_backward_is_one_update():
    # the steps run from post-accumulate-grad hooks; the backward's event comes at its end
    t = TraceBuilder()
    for _ in range(3):
        for opt in range(4):
            step(t, 12, opt=opt)
            t.clear([opt], line=13)
        t.backward(fresh=[0, 1, 2, 3], line=22)
    rows = shape_strings(t.trace)
    assert sum(n for n, _, _ in rows) == 3, rows  # three updates, not twelve
    assert rows[0][:2] == (1, "1–4")


def test_two_training_loops_in_a_row_are_not_one_turn(tmp_path, monkeypatch):
    from graddoctor.options import CheckOptions
    from graddoctor.run.session import run_check

    monkeypatch.chdir(tmp_path)
    loop = ("for _ in range(3):\n    opt{n}.zero_grad()\n"
            "    m{n}(torch.randn(8, 4)).pow(2).mean().backward()\n    opt{n}.step()\n")
    (tmp_path / "train.py").write_text(
        "import torch\n" + "".join(
            f"m{n} = torch.nn.Linear(4, 1)\nopt{n} = torch.optim.SGD(m{n}.parameters(), lr=0.1)\n"
            + loop.format(n=n) for n in (1, 2)))
    report = run_check(CheckOptions(target="train.py"))
    rows = [(s.updates, step_ranges(s.steps)) for s in shapes(report.analysis)]
    assert rows == [(3, "1–3"), (3, "4–6")]
