"""ddp-average-redone (GD298) on hand-written traces: a DDP model's loss divided by the world
size (the source names it), its averaged gradients all-reduced again by hand; the look-alikes
it stays silent on. The 2-rank runs are fixtures/ddp/*ddp_*world*, *allreduced*."""

from __future__ import annotations

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.ddp_average_redone import world_division
from rule_traces import P, builder

SLUG = "ddp-average-redone"

SCRIPT = """import torch.distributed as dist
model = DDP(net)
for x, y in loader:
    opt.zero_grad()
    loss = criterion(model(x), y) {op}
    loss.backward()
    opt.step()
"""


def _trace(world=2, factor=0.5, terms=("mean",), updates=3, allreduce=True, cls="SGD", ddp=True,
           backwards=1):
    t = builder(cls=cls)
    if ddp:
        t.put(ev.ddp_init(ddp=0, params=list(P), world=world), 2)
    for _ in range(updates):
        t.clear(P, opt=0, line=4)
        for i in range(backwards):
            extra = {"allreduce": allreduce if i == backwards - 1 else False} if ddp else {}
            grads = {"fresh": P} if i == 0 else {"accumulated": P}
            t.backward(line=6, loss_scale_factor=factor, loss_terms=list(terms), **grads, **extra)
        t.step(0, line=7)
    return t


def _check(tmp_path, t, op="/ dist.get_world_size()"):
    (tmp_path / "train.py").write_text(SCRIPT.format(op=op))
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_the_loss_divided_by_the_world_size_is_reported_at_its_line(tmp_path):
    [f] = _check(tmp_path, _trace())
    assert (f.location.line, f.severity, f.step) == (5, Severity.WARNING, 1)
    assert "divided by the world size (2)" in f.message and "2 times smaller" in f.message
    assert f.evidence["cause"] == "loss_divided" and f.evidence["updates"] == 3
    assert [r.location.line for r in f.related] == [6, 7]
    assert "drop the division by the world size" in f.fix


def test_accumulation_windows_add_their_factors(tmp_path):
    # loss / (accum * world) over accum micro-batches: 1/world in the window
    t = _trace(world=4, factor=1 / 8, backwards=2)
    [f] = _check(tmp_path, t, op="/ (accum_steps * world_size)")
    assert f.evidence["world_size"] == 4


def test_adam_without_clipping_is_info(tmp_path):
    [f] = _check(tmp_path, _trace(cls="AdamW"))
    assert f.severity == Severity.INFO and "AdamW largely cancels" in f.message


@pytest.mark.parametrize("case", [
    {"op": "* 0.5"},  # a loss weight equal to 1 / world: the source does not name the ranks
    {"op": "/ accum_steps"},
    {"trace": {"factor": 0.25}},  # divided by more than the world size (not 1/world)
    {"trace": {"factor": 1.0}},
    {"trace": {"terms": ("sum",)}},  # a summed loss normalised by a count
    {"trace": {"ddp": False}},  # hand-written data parallelism: loss / world is its mean
    {"trace": {"world": 1, "factor": 1.0}},
    {"trace": {"allreduce": False}},  # under no_sync(): step-without-allreduce's
    {"trace": {"updates": 1}},
])
def test_look_alikes_are_silent(tmp_path, case):
    t = _trace(**case.get("trace", {}))
    assert _check(tmp_path, t, op=case.get("op", "/ dist.get_world_size()")) == []


def _summed(t, scale=1.0, op="sum", factor=1.0, allreduce=True, world=2):
    t.clear(P, opt=0, line=4)
    t.backward(fresh=P, line=6, loss_scale_factor=factor, loss_terms=["mean"], allreduce=allreduce)
    t.put(ev.grad_allreduce(opt=0, op=op, world=world, params=len(P), via="grad", scale=scale,
                            before=False), 9)
    t.step(0, line=10)


def test_gradients_all_reduced_again_after_ddp_are_reported_at_the_all_reduce():
    t = builder()
    t.put(ev.ddp_init(ddp=0, params=list(P), world=2), 2)
    for _ in range(3):
        _summed(t)
    [f] = find_rule(SLUG)().check(Analysis(t.trace))
    assert (f.location.line, f.severity, f.evidence["cause"]) == (9, Severity.WARNING, "summed_again")
    assert "2x the mean gradient" in f.message and "(3 updates like this" in f.message
    assert "remove this all_reduce" in f.fix


@pytest.mark.parametrize("case", [
    {"scale": 0.5},  # divided by the world size right after: the mean again
    {"op": "avg"},
    {"factor": 0.5},  # the loss divided by the world size: the sum of the means is the mean
    {"allreduce": None},  # no DDP forward: allreduce-not-averaged's
])
def test_all_reduce_look_alikes_are_silent(case):
    t = builder()
    t.put(ev.ddp_init(ddp=0, params=list(P), world=2), 2)
    for _ in range(3):
        _summed(t, **case)
    assert list(find_rule(SLUG)().check(Analysis(t.trace))) == []


@pytest.mark.parametrize("text, divides", [
    ("loss = criterion(out, y) / world_size", True),
    ("loss = loss / dist.get_world_size()", True),
    ("loss /= args.world_size", True),
    ("loss = loss * (1 / accelerator.num_processes)", True),
    ("loss = loss / (accum * n_gpus)", True),
    ("loss = loss / accum_steps", False),
    ("loss = 0.5 * criterion(out, y)", False),
    ("loss = loss.sum() / labels.numel()", False),
])
def test_the_source_names_the_world_size(text, divides):
    assert world_division(text) is divides
