"""constraint-before-step (GD194): what reads as a constraint write, when a step breaks it, the
watcher over short real loops (written before or after the step, re-applied, kept by the step),
and the rule's search for the line that wrote it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.constraints import _ELEMENTS, _keep, _rows, _unchanged, broken, classify
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "constraint-before-step"


# -- what a write establishes ------------------------------------------------------------------
def test_a_clamp_a_mask_and_a_row_norm_are_constraints():
    torch.manual_seed(0)
    old = torch.randn(6, 8, dtype=torch.float64)
    kind, lower, upper, written = classify(old, old.clamp(-0.5, 0.5))
    assert (kind, lower, upper) == ("clamp", -0.5, 0.5) and written == int((old.abs() > 0.5).sum())
    assert classify(old, old.clamp(min=0))[:3] == ("clamp", 0.0, None)
    mask = torch.rand(6, 8) > 0.5
    kind, where, _ = classify(old, old * mask)
    assert kind == "zero" and torch.equal(where, ~mask)
    capped = classify(old, torch.renorm(old, 2, 0, 2.0))
    assert capped[0] == "norm" and abs(capped[1] - 2.0) < 1e-6 and not capped[2]  # max-norm
    small = old / 2.5  # rows on both sides of 1: some are scaled up to it
    unit = classify(small, F.normalize(small, dim=1))
    assert unit[0] == "norm" and abs(unit[1] - 1.0) < 1e-6 and unit[2]


def test_a_parameter_kept_whole_samples_as_it_did_and_compares_by_equality():
    torch.manual_seed(0)
    for t in (torch.randn(5, 7), torch.randn(9).half(), torch.tensor(2.5), torch.randn(3, 4, 2)):
        kept, whole = _keep(t)
        assert whole and torch.equal(_rows(kept), _rows(t)) and _rows(kept).dtype == torch.float64
        assert _unchanged(kept, t)
        t.view(-1)[0] += 1
        assert not _unchanged(kept, t)
    big = torch.randn(2 * _ELEMENTS // 8, 8)
    values, whole = _keep(big)
    assert not whole and torch.equal(values, _rows(big))
    with_nan = torch.tensor([float("nan"), 1.0])
    assert not _unchanged(_keep(with_nan)[0], with_nan)  # left to classify, which turns it away
    assert not _unchanged(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not _unchanged(torch.zeros(4), torch.zeros(4, dtype=torch.float64))


def test_writes_that_set_no_constraint_are_none():
    torch.manual_seed(0)
    old = torch.randn(6, 8, dtype=torch.float64)
    assert classify(old, old) is None  # nothing written
    assert classify(old, old * 0.999) is None  # a decay by hand: rows of many norms
    assert classify(old, old + 0.01 * torch.randn(6, 8, dtype=torch.float64)) is None  # SAM's restore
    one = old.clone()
    one[0, 0] = 0.0
    assert classify(old, one) is None  # a single entry
    vector = torch.randn(1, 10, dtype=torch.float64)
    assert classify(vector, vector * 0.5) is None  # one row scaled: no bound over rows


def test_what_breaks_each_constraint():
    torch.manual_seed(0)
    old = torch.randn(6, 8, dtype=torch.float64)
    clamp = classify(old, old.clamp(-0.5, 0.5))
    assert broken(clamp, old.clamp(-0.5, 0.5)) == 0
    assert broken(clamp, old.clamp(-0.5, 0.5) * 1.1) > 0
    mask = torch.rand(6, 8) > 0.5
    zero = classify(old, old * mask)
    assert broken(zero, old * mask) == 0 and broken(zero, old * mask + 0.01) == int((~mask).sum())
    capped = classify(old, torch.renorm(old, 2, 0, 2.0))
    assert broken(capped, torch.renorm(old, 2, 0, 2.0) * 0.9) == 0  # under the cap
    assert broken(capped, torch.renorm(old, 2, 0, 2.0) * 1.1) > 0
    small = old / 2.5
    unit = classify(small, F.normalize(small, dim=1))
    assert broken(unit, F.normalize(old, dim=1) * 0.9) == 6  # every row must have the norm
    assert broken(unit, F.normalize(old, dim=1)) == 0


# -- the watcher ----------------------------------------------------------------------------------
def _run(write, where, opt_cls=torch.optim.SGD, steps=6, **opt_kwargs):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        net = nn.Linear(8, 4)
        optimizer = opt_cls(net.parameters(), **(opt_kwargs or {"lr": 0.1, "momentum": 0.9}))
        x, y = torch.randn(32, 8), torch.randn(32, 4)
        for _ in range(steps):
            optimizer.zero_grad()
            F.mse_loss(net(x), y).backward()
            if where in ("before", "both"):
                write(net)
            optimizer.step()
            if where in ("after", "both"):
                write(net)
    return [e.data for e in rec.trace.of_kind("constraint_broken")]


def _clip(net):
    for p in net.parameters():
        p.data.clamp_(-0.05, 0.05)


def _mask(net, keep=torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) > 0.5):
    with torch.no_grad():
        net.weight.mul_(keep)


def _mask_with_grad(net, keep=torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) > 0.5):
    with torch.no_grad():
        net.weight.mul_(keep)
        net.weight.grad.mul_(keep)


def _unit_rows(net):
    with torch.no_grad():
        net.weight.div_(net.weight.norm(dim=1, keepdim=True))


def test_the_watcher_tells_a_constraint_written_before_the_step():
    (clip,) = _run(_clip, "before")
    assert clip["kinds"] == ["clamp"] and clip["params"] and clip["times"] >= 2
    assert clip["bounds"][0] == [-0.05, 0.05] and clip["broken"] > 0 and clip["backward"] is not None
    (mask,) = _run(_mask, "before", torch.optim.Adam, lr=0.01)
    assert mask["kinds"] == ["zero"] and len(mask["params"]) == 1
    (rows,) = _run(_unit_rows, "before")
    assert rows["kinds"] == ["norm"]


def test_the_watcher_is_silent_after_the_step_on_both_sides_and_when_the_step_keeps_it():
    assert _run(_clip, "after") == []
    assert _run(_mask, "after", torch.optim.Adam, lr=0.01) == []
    assert _run(_clip, "both") == []
    assert _run(_mask_with_grad, "before", torch.optim.SGD, lr=0.1) == []  # the zeros stay zero
    assert _run(_mask_with_grad, "before", torch.optim.Adam, lr=0.01) == []


def test_a_write_undone_once_is_not_told():
    assert _run(_clip, "before", steps=2) == []  # step 1 registers, step 2's write is judged once


# -- the rule ---------------------------------------------------------------------------------------
def _event(t, line=9, backward=None, kinds=("clamp",)):
    t.put(ev.constraint_broken(opt=0, params=[0, 1], kinds=list(kinds), bounds=[[-0.01, 0.01]] * 2,
                               written=40, broken=12, times=3, backward=backward), line)
    return t


def test_a_broken_constraint_is_a_warning_at_the_step_when_no_write_is_found():
    f = only(_event(builder()), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert "before optimizer.step()" in f.message and "outside the clamp" in f.message


def test_no_event_no_finding():
    assert findings(builder(), SLUG) == []


def test_points_at_the_write_between_the_backward_and_the_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "for it in range(10):\n"                            # 1
        "    loss = critic(x).mean()\n"                     # 2
        "    opt_d.zero_grad()\n"                           # 3
        "    loss.backward()\n"                             # 4
        "    print(loss)\n"                                 # 5
        "    for p in critic.parameters():\n"               # 6
        "        p.data.clamp_(-0.01, 0.01)\n"              # 7
        "    opt_d.step()\n"                                # 8
        "    gen.weight.data.mul_(0.5)\n")                  # 9
    t = _event(TraceBuilder(str(script)), line=8, backward=[str(script), 4])
    (found,) = find_rule(SLUG)().check(Analysis(t.trace))
    assert found.location.line == 7 and "opt_d.step()" in found.message
    assert [r.location.line for r in found.related] == [8]
    script.write_text(script.read_text().replace("        p.data.clamp_(-0.01, 0.01)\n",
                                                 "        project(p)\n"))
    t = _event(TraceBuilder(str(script)), line=8, backward=[str(script), 4])
    (found,) = find_rule(SLUG)().check(Analysis(t.trace))
    assert found.location.line == 7  # a helper of the script's called there
    for write in ("        p.masked_fill_(p.abs() > 0.01, 0.0)\n", "        p[p.abs() > 0.01] = 0.0\n"):
        lines = script.read_text().splitlines(keepends=True)
        script.write_text("".join(lines[:6] + [write] + lines[7:]))
        t = _event(TraceBuilder(str(script)), line=8, backward=[str(script), 4])
        (found,) = find_rule(SLUG)().check(Analysis(t.trace))
        assert found.location.line == 7, write
    t = _event(TraceBuilder(str(script)), line=8, backward=None)
    (found,) = find_rule(SLUG)().check(Analysis(t.trace))
    assert found.location.line == 8  # no backward to bound the search: the step


def test_mask_applied_once_leaves_a_mask_rewritten_before_the_step_to_this_rule():
    t = builder()
    t.put(ev.mask_regrown(cls="MaskedLinear", param="weight", mask="mask", regrown=4, masked=8,
                          steps=1, defined_at=None, pid=0), 5)
    assert len(findings(t, "mask-applied-once")) == 1
    _event(t, kinds=("zero",))
    assert findings(t, "mask-applied-once") == []
