"""ddp-forward-bypassed (GD406): a DDP-wrapped model trained through ``model.module``, on
hand-written traces (the rule), on a small loop under the instrumentation in a one-rank process
group (the ``ddp_init`` event and the backwards' ``allreduce``), and the replicas-diverge merge
that leaves such an optimizer to it."""

from __future__ import annotations

import gc

from dataclasses import replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.report.merge import Part, merge
from graddoctor.report.model import Report, RunInfo
from graddoctor.rules import ALL_RULES
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "ddp-forward-bypassed"


def trace(allreduce=(None, None, None), world=2, clear_between=False, init=True):
    """A DDP over pids 0, 1 (line 9), an optimizer owning them (line 10); one backward per
    update, with the DDP forward's ``allreduce`` decision or none (None: no DDP forward)."""
    t = TraceBuilder()
    t.param(0, "model.module.weight")
    t.param(1, "model.module.bias")
    if init:
        t.put(ev.ddp_init(ddp=0, params=[0, 1], world=world), 9)
    t.optimizer(0, [0, 1], line=10)
    for decision in allreduce:
        t.clear([0, 1], line=12)
        extra = {} if decision is None else {"allreduce": decision}
        t.backward(fresh=[0, 1], line=14, **extra)
        t.step(0, line=15)
    return t


def test_updates_without_a_ddp_forward_are_an_error_with_several_ranks():
    f = only(trace(), SLUG)
    assert f.severity == Severity.ERROR and f.location.line == 14
    assert "with 2 ranks" in f.message and "model.module.weight" in f.message
    assert f.evidence["updates"] == 3 and "model(x)" in f.fix
    assert [r.location.line for r in f.related] == [9, 15]


def test_one_rank_is_a_warning():
    f = only(trace(world=1), SLUG)
    assert f.severity == Severity.WARNING and "on one rank nothing differs" in f.message


def test_silent_when_ddp_forward_runs_or_too_few_updates_or_no_ddp():
    assert findings(trace(allreduce=(True, True, True)), SLUG) == []
    assert findings(trace(allreduce=(False, True, False, True)), SLUG) == []  # no_sync windows
    assert findings(trace(allreduce=(None, True, True)), SLUG) == []  # one update only
    assert findings(trace(init=False), SLUG) == []


def test_a_window_with_one_ddp_forward_is_reduced():
    t = TraceBuilder()
    t.put(ev.ddp_init(ddp=0, params=[0, 1], world=2), 9)
    t.optimizer(0, [0, 1], line=10)
    for _ in range(3):
        t.backward(fresh=[0, 1], line=14, allreduce=True)
        t.backward(accumulated=[1], line=16)  # an aux loss through model.module.head
        t.step(0, line=17)
    assert findings(t, SLUG) == []


def test_gradients_cleared_before_the_step_do_not_count():
    t = TraceBuilder()
    t.put(ev.ddp_init(ddp=0, params=[0, 1], world=2), 9)
    t.optimizer(0, [0, 1], line=10)
    for _ in range(3):
        t.backward(fresh=[0, 1], line=13)  # a probe through model.module, then discarded
        t.clear([0, 1], line=14)
        t.backward(fresh=[0, 1], line=15, allreduce=True)
        t.step(0, line=16)
    assert findings(t, SLUG) == []


def _train(through_module: bool):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            net = model.module if through_module else model
            torch.nn.functional.mse_loss(net(torch.randn(8, 4)), torch.randn(8, 1)).backward()
            opt.step()
    return rec.trace


def _loop(through_module: bool):
    torch.manual_seed(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        trace = _train(through_module)
        # the DDP model (in reference cycles with the recorder) freed while its process group
        # lives: a gloo group destroyed by a later collection hung joining its threads
        gc.collect()
    finally:
        dist.destroy_process_group()
    return trace


def test_the_instrumentation_records_the_wrapper_and_the_missing_forward():
    bypassed = _loop(True)
    [init] = bypassed.of_kind("ddp_init")
    assert init["world"] == 1 and len(init["params"]) == 2
    assert all("allreduce" not in b.data for b in bypassed.of_kind("backward"))
    assert findings(bypassed, SLUG)
    through = _loop(False)
    assert all(b.get("allreduce") is True for b in through.of_kind("backward"))
    assert findings(through, SLUG) == []


def test_replicas_diverge_leaves_a_bypassed_wrapper_to_this_rule():
    def part(rank, values, bypassed):
        report = Report(run=RunInfo(script="train.py", argv=[], status="step-limit", steps=10,
                                    backward_calls=10, step_budget=10, torch_version="2.13.0+cpu"),
                        findings=[])
        report = replace(report, run=replace(report.run, checksums=[
            {"opt": 0, "step": s + 1, "value": v, "path": "train.py", "line": 16, "layout": 7,
             "initial": 5.0, **({"bypassed": True} if bypassed else {})}
            for s, v in enumerate(values)]))
        return Part(report, rank, f"rank {rank}")

    drift = merge([part(0, [1.0, 2.0], False), part(1, [1.5, 2.5], False)], world_size=2, rules=ALL_RULES)
    assert [f.rule for f in drift.findings] == ["replicas-diverge"]
    left = merge([part(0, [1.0, 2.0], True), part(1, [1.5, 2.5], True)], world_size=2, rules=ALL_RULES)
    assert left.findings == []


def test_under_accelerate_the_fix_names_unwrap_model():
    t = TraceBuilder()
    t.put(ev.ddp_init(ddp=0, params=[0, 1], world=2), 9)
    t.optimizer(0, [0, 1], line=10)
    for _ in range(3):
        t.via = "accelerate"  # accelerator.backward(loss)
        t.backward(fresh=[0, 1], line=14)
        t.via = "accelerate"
        t.step(0, line=15)
    f = only(t, SLUG)
    assert "accelerator.unwrap_model(model)" in f.fix and "accelerator.prepare()" in f.fix
