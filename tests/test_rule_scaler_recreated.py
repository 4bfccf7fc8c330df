"""scaler-recreated (GD158) on hand-written traces: a GradScaler built again at one line, each
one used for a single optimizer step; and once on a real run. No torch in the trace tests."""

from __future__ import annotations

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules.scaler_recreated import ScalerRecreated
from graddoctor.trace import TraceBuilder


def check(t):
    return list(ScalerRecreated().check(Analysis(t.trace)))


def loop(t, n=4, steps_each=1, line=lambda i: 7, opt=lambda i: 0, enabled=True, requested=True,
         load=False, skipped=False, scale=65536.0):
    """``n`` scalers, each built at ``line(i)`` and used for ``steps_each`` updates of ``opt(i)``."""
    for i in range(n):
        if opt(i) not in {e["opt"] for e in t.trace.of_kind("optimizer_init")}:
            t.optimizer(opt(i), [opt(i)], line=3)
        t.put(ev.scaler_init(scaler=i, cls="GradScaler", enabled=enabled, requested=requested,
                             init_scale=scale), line(i))
        if load:
            t.put(ev.scaler_load(scaler=i), 8)
        for _ in range(steps_each):
            t.clear([opt(i)], opt=opt(i), line=9)
            t.backward(fresh=[opt(i)], line=10, scaled=True, scale=scale, scaler=i,
                       scaler_enabled=enabled)
            t.put(ev.unscale(scaler=i, opt=opt(i), enabled=enabled, implicit=True, scale=scale), 11)
            t.step(opt(i), line=11, skipped=skipped)
            t.put(ev.scaler_step(scaler=i, opt=opt(i), enabled=enabled, fused=False,
                                 skipped=skipped, found_inf=skipped), 11)
            t.put(ev.scaler_update(scaler=i, enabled=enabled, scale=scale), 12)


def test_a_scaler_rebuilt_every_step_is_a_warning_at_its_construction():
    t = TraceBuilder()
    loop(t)
    [f] = check(t)
    assert f.location.line == 7 and f.severity == Severity.WARNING
    assert "4 times" in f.message and "(65536)" in f.message
    assert f.evidence["constructions"] == 4 and f.evidence["restarts"] == 3


def test_every_step_skipped_says_the_optimizer_never_updated():
    t = TraceBuilder()
    loop(t, skipped=True, scale=2.0**24)
    [f] = check(t)
    assert "never updated" in f.message and f.evidence["steps_skipped"] == 4


def test_a_scaler_per_epoch_is_silent():
    t = TraceBuilder()
    loop(t, n=3, steps_each=4)
    assert check(t) == []


def test_two_rebuilds_are_not_yet_the_loop():
    t = TraceBuilder()
    loop(t, n=2)
    assert check(t) == []


@pytest.mark.parametrize("kw", [
    {"load": True},  # each one resumes from the previous one's state_dict
    {"enabled": False, "requested": False},  # enabled=False on purpose
    {"enabled": False, "requested": None},  # a subclass of its own, turned off: unknown why
    {"opt": lambda i: i},  # a new training run per scaler, each over its own optimizer
    {"line": lambda i: 7 + 10 * i},  # different lines: stages, not a loop
])
def test_look_alikes_are_silent(kw):
    t = TraceBuilder()
    loop(t, **kw)
    assert check(t) == [], kw


def test_a_cuda_scaler_off_for_want_of_cuda_is_still_reported():
    t = TraceBuilder()
    loop(t, enabled=False, requested=True)
    [f] = check(t)
    assert "for want of CUDA" in f.message and f.evidence["enabled_in_run"] is False


def test_an_unused_scaler_between_is_no_restart():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for i in range(4):
        t.put(ev.scaler_init(scaler=i, cls="GradScaler", enabled=True, requested=True), 7)
        t.clear([0], opt=0, line=9)
        t.backward(fresh=[0], line=10)
        t.step(0, line=11)
    assert check(t) == []


def test_a_real_run_records_construction_and_load(tmp_path):
    from graddoctor.api import check_script

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "state = None\n"
        "for _ in range(4):\n"
        "    scaler = torch.amp.GradScaler('cpu', init_scale=1024.0)\n"
        "    if state is not None and RESUME:\n"
        "        scaler.load_state_dict(state)\n"
        "    opt.zero_grad()\n"
        "    scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
        "    state = scaler.state_dict()\n")
    text = script.read_text()
    script.write_text(text.replace("RESUME", "False"))
    report = check_script(str(script))
    found = [f for f in report.findings if f.rule == "scaler-recreated"]
    assert [f.location.line for f in found] == [6] and "(1024)" in found[0].message
    script.write_text(text.replace("RESUME", "True"))
    report = check_script(str(script))
    assert not [f for f in report.findings if f.rule == "scaler-recreated"]
