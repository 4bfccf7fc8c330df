"""allreduce-not-averaged (GD405) on hand-written traces (where it reports, the look-alikes it
stays silent on), and the DDP watcher's judgement of the script's own all-reduces in-process,
in a process group of one rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules import find_rule
from rule_traces import P, builder, findings, fold_hard, only

SLUG = "allreduce-not-averaged"


def update(t, world=2, op="sum", scale=1.0, before=False, via="grad", factor=1.0,
           terms=("mean",), backwards=1, allreduce_line=14, ddp=None, step=True):
    """One update of hand-written data parallelism: clear, backward(s), the all-reduce's
    judgement (recorded at the step's pre hook), the step."""
    t.clear(P, opt=0, line=10)
    for _ in range(backwards):
        extra = {} if ddp is None else {"allreduce": ddp}
        t.backward(fresh=P, line=12, loss_scale_factor=factor,
                   loss_terms=list(terms) if terms is not None else None, **extra)
    t.put(ev.grad_allreduce(opt=0, op=op, world=world, params=len(P), via=via, scale=scale,
                            before=before), allreduce_line)
    if step:
        t.step(0, line=16)


def test_a_sum_never_divided_is_reported_at_the_all_reduce():
    t = builder()
    for _ in range(3):
        update(t, world=4)
    f = only(t, SLUG)
    assert (f.location.line, f.severity, f.step) == (14, Severity.WARNING, 1)
    assert "4x the mean gradient" in f.message
    assert "(3 of the 3 updates checked, first at step 1)" in f.message
    assert f.evidence["world_size"] == 4 and f.evidence["updates"] == 3
    assert [r.location.line for r in f.related] == [16, 12]


def test_the_message_counts_the_updates_checked_at_that_line():
    t = builder()
    update(t, scale=0.5)  # averaged at the first update
    update(t)
    update(t)
    assert "(2 of the 3 updates checked, first at step 2)" in only(t, SLUG).message


def test_a_flat_buffer_says_so():
    t = builder()
    update(t, via="flat")
    assert "a flat buffer of 2 gradients" in only(t, SLUG).message


@pytest.mark.parametrize("look_alike", [
    {"scale": 0.5},  # divided by the world size after the all-reduce (the tutorial)
    {"scale": 0.3},  # something else scaled it in between (a clip that bound): not judged
    {"scale": None},  # the gradients disagree
    {"op": "avg"},
    {"op": "max"},
    {"before": True},  # divided before the all-reduce
    {"world": 1},  # a single process: the sum over one rank is its mean
    {"factor": 0.5},  # the loss divided by the world size
    {"factor": 0.25},  # by more than that (world size times accumulation steps)
    {"factor": None, "terms": None},  # divided by a computed tensor: cannot tell
    {"terms": ("sum",)},  # a summed loss, normalised by a count of the script's own
    {"factor": 1 / 16, "terms": ("sum",)},  # a sum over the global batch
    {"ddp": True},  # a DistributedDataParallel forward: DDP averages itself
])
def test_look_alikes_are_silent(look_alike):
    t = builder()
    for _ in range(3):
        update(t, **look_alike)
    assert findings(t, SLUG) == []


def test_accumulation_adds_the_micro_batches_factors():
    t = builder()
    update(t, factor=0.5, backwards=2)  # loss / k over k = 2 micro-batches: a sum over ranks
    assert len(findings(t, SLUG)) == 1
    t = builder()
    update(t, factor=0.25, backwards=2)  # loss / (k * world): the mean
    assert findings(t, SLUG) == []


def test_no_backward_in_the_update_is_not_judged():
    t = builder()
    t.backward(fresh=P, line=12)
    t.step(0, line=16)
    t.put(ev.grad_allreduce(opt=0, op="sum", world=2, params=2, via="grad", scale=1.0,
                            before=False), 14)
    t.step(0, line=16)
    assert findings(t, SLUG) == []


def test_adam_without_clipping_is_info():
    t = builder(cls="Adam")
    update(t)
    f = only(t, SLUG)
    assert f.severity == Severity.INFO and "Adam largely cancels" in f.message


def test_updates_folded_out_of_a_long_run_are_counted():
    t = builder()
    for _ in range(8):
        update(t)
    folded = Analysis(fold_hard(t.trace))
    assert folded.of_kind("folded")
    [f] = find_rule(SLUG)().check(folded)
    assert f.evidence["updates"] == 8 and "(8 of the 8 updates checked" in f.message


def test_the_fix_names_the_scripts_tensor_and_module(tmp_path):
    script = tmp_path / "train.py"
    lines = (["import torch.distributed as dist"] + ["pass"] * 11
             + ["for p in params:", "    dist.all_reduce(p.grad)"])
    script.write_text("\n".join(lines) + "\n")
    t = builder()
    update(t)
    [f] = find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path)))
    assert "`p.grad /= dist.get_world_size()` right after this all_reduce" in f.fix
    assert "op=dist.ReduceOp.AVG" in f.fix


# -- the watcher, in-process, in a process group of one rank ------------------------------------

def _judged(reduce, loss_div=1.0, world=None, monkeypatch=None, steps=4, optimizer=torch.optim.SGD):
    """The ``grad_allreduce`` events of a small loop whose gradients ``reduce(model)``
    all-reduces by hand, and the run's internal errors."""
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        if world is not None:  # the group says it has more ranks (the sum is still one rank's)
            monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
        with Instrumentation(rec):
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            opt = optimizer(model.parameters(), lr=0.1)
            for _ in range(steps):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
                (loss / loss_div).backward()
                reduce(model)
                opt.step()
    finally:
        dist.destroy_process_group()
    trace = rec.trace
    return trace, trace.of_kind("grad_allreduce"), trace.of_kind("internal_error")


def _per_param(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _tutorial(model):
    size = 2.0
    for p in model.parameters():
        dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)
        p.grad.data /= size


def _divided_first(model):
    for p in model.parameters():
        p.grad /= 2
        dist.all_reduce(p.grad)


def _flat(divide):
    def reduce(model):
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= divide
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
    return reduce


def _metric(model):
    stats = torch.tensor([1.0, 8.0])
    dist.all_reduce(stats)


def _async(model):
    works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
    for w in works:
        w.wait()


@pytest.mark.parametrize("reduce, via, scale, before", [
    (_per_param, "grad", 1.0, False),
    (_tutorial, "grad", 0.5, False),  # through .data: only the values tell
    (_divided_first, "grad", 1.0, True),
    (_flat(1), "flat", 1.0, False),
    (_flat(2), "flat", 0.5, False),
])
def test_the_watcher_compares_what_the_step_applies_with_what_the_all_reduce_made(
        reduce, via, scale, before):
    trace, judged, errors = _judged(reduce)
    assert not errors, errors
    assert len(judged) == 3  # the first updates only
    assert {(e["op"], e["world"], e["params"], e["via"], e["scale"], e["before"]) for e in judged} \
        == {("sum", 1, 4, via, scale, before)}
    assert all(e.loc.path.endswith("test_rule_allreduce_not_averaged.py") for e in judged)
    assert findings(trace, SLUG) == []  # one rank


def test_metrics_async_calls_and_avg_record_no_sum_to_judge():
    for reduce in (_metric, _async):
        _trace, judged, errors = _judged(reduce)
        assert not errors and judged == []
    _trace, judged, errors = _judged(lambda m: [dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
                                                for p in m.parameters()])
    assert not errors and {e["op"] for e in judged} == {"avg"}


def test_the_all_reduce_still_does_what_it_did():
    t = torch.tensor([1.0, 2.0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Instrumentation(Recorder(step_budget=None)):
            assert dist.all_reduce(t) is None
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            with pytest.raises(TypeError):
                dist.all_reduce("not a tensor")
    finally:
        dist.destroy_process_group()
    assert t.tolist() == [1.0, 2.0]


def test_with_a_world_of_two_the_rule_reports_the_loop_and_not_the_loss_divided_by_it(monkeypatch):
    trace, judged, errors = _judged(_per_param, world=2, monkeypatch=monkeypatch)
    assert not errors and {e["world"] for e in judged} == {2}
    [f] = findings(trace, SLUG)
    assert "2x the mean gradient" in f.message
    trace, _judged_events, _ = _judged(_per_param, loss_div=2.0, world=2, monkeypatch=monkeypatch)
    assert findings(trace, SLUG) == []
    trace, _judged_events, _ = _judged(_tutorial, world=2, monkeypatch=monkeypatch)
    assert findings(trace, SLUG) == []


def test_only_the_first_updates_that_all_reduce_anything_are_looked_at(monkeypatch):
    """A metric all-reduced at every update (it matches no gradient) costs norms during the
    first updates only, like the gradients' all-reduces."""
    from graddoctor.instrument import ddp

    calls = []
    norm = ddp._norm
    monkeypatch.setattr(ddp, "_norm", lambda t: calls.append(1) or norm(t))
    per_update = []

    def reduce(model):
        before = len(calls)
        _metric(model)
        per_update.append(len(calls) - before)

    _trace, judged, errors = _judged(reduce, steps=6)
    assert not errors and judged == []
    assert all(per_update[:3]) and per_update[3:] == [0, 0, 0]
