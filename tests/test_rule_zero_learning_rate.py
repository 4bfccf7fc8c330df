"""zero-learning-rate (GD116) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "zero-learning-rate"


def _run(lrs, cls="SGD", scheduler=None, base=(0.0,)):
    t = builder(cls=cls)
    if scheduler:
        sched_init(t, cls=scheduler, lrs=(lrs[0],), base=base)
    for lr in lrs:
        update(t, lr=lr)
        if scheduler:
            sched_step(t, cls=scheduler, lrs=[lr])
    return t


def test_lr_zero_as_built_at_every_update_is_a_warning_at_the_construction():
    f = only(_run([0.0] * 4), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 1
    assert f.evidence["updates"] == 4 and "4 updates" in f.message


def test_a_schedule_over_a_base_lr_of_zero_is_reported_with_it():
    f = only(_run([0.0] * 3, scheduler="CosineAnnealingLR"), SLUG)
    assert "CosineAnnealingLR" in f.message and f.evidence["scheduler"] == "CosineAnnealingLR"


def test_silent_when_the_lr_can_still_rise_or_is_not_used():
    assert findings(_run([0.0, 0.0, 0.01]), SLUG) == []  # a warm-up from 0
    # a factor of 0 for now over a positive base lr (a per-epoch warm-up)
    assert findings(_run([0.0] * 3, scheduler="LambdaLR", base=(0.1,)), SLUG) == []
    assert findings(_run([0.0] * 3, scheduler="OneCycleLR"), SLUG) == []  # sets its own lr
    assert findings(_run([0.0] * 3, cls="MyOptimizer"), SLUG) == []  # may not read "lr"


# -- one param group at lr 0 next to groups that train ------------------------------------------

def _groups(tmp_path, group_text: str, lrs=(0.0, 0.1), steps=3):
    from graddoctor import events as ev
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    (tmp_path / "train.py").write_text(
        "opt = torch.optim.SGD([\n"
        f"    {{'params': a.parameters(), 'lr': {group_text}}},\n"
        "    {'params': b.parameters(), 'lr': 0.1},\n"
        "])\n")
    t = TraceBuilder()
    t._params([0, 1])
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=[0, 1], lrs=list(lrs)), 1)
    for _ in range(steps):
        t.backward(fresh=[0, 1], line=6)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=list(lrs)), 7)
        t.step(line=7)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_one_group_whose_lr_rounds_to_zero_is_reported_at_its_lr(tmp_path):
    found = _groups(tmp_path, "base_lr * (bs // 256)")
    assert len(found) == 1 and found[0].location.line == 2 and found[0].evidence["group"] == 0
    assert "`//`" in found[0].fix
    assert len(_groups(tmp_path, "int(scale) * base_lr")) == 1


def test_one_group_frozen_on_purpose_is_silent(tmp_path):
    assert _groups(tmp_path, "0.0") == []
    assert _groups(tmp_path, "cfg.backbone_lr") == []
    assert _groups(tmp_path, "base_lr * (bs // 256)", lrs=(0.0, 0.0)) != []  # every group: as before
    assert _groups(tmp_path, "base_lr * (bs // 256)", lrs=(0.05, 0.1)) == []  # it did not round to 0


def test_the_statement_that_rounds_a_hand_written_lr(tmp_path):
    from graddoctor.analysis.source import rounding_behind
    script = tmp_path / "train.py"
    script.write_text(
        "def lr_at(step):\n"
        "    if step < warmup:\n"
        "        return base * (step // warmup)\n"
        "    return base\n"
        "for step in range(9):\n"
        "    g['lr'] = lr_at(step)\n"
        "    g['lr'] = base * int(step / warmup)\n"
        "    g['lr'] = base * step / warmup\n")
    assert rounding_behind(str(script), 6) == (3, "return base * (step // warmup)")
    assert rounding_behind(str(script), 7) == (7, "g['lr'] = base * int(step / warmup)")
    assert rounding_behind(str(script), 8) is None


def test_a_hand_written_lr_held_at_zero_by_rounding_is_a_warning_at_the_rounding(tmp_path):
    from graddoctor.options import CheckOptions
    from graddoctor.run.session import run_check
    script = tmp_path / "train.py"
    body = (
        "import torch\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(8):\n"
        "    for g in opt.param_groups:\n"
        "        g['lr'] = 0.1 * {factor}\n"
        "    opt.zero_grad()\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()\n")
    script.write_text(body.format(factor="(step // 100)"))
    found = [f for f in run_check(CheckOptions(target=str(script))).findings
             if f.rule == "zero-learning-rate"]
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 6 and "use `/`" in found[0].fix
    script.write_text(body.format(factor="(step / 100)"))  # 0 at the first update only
    assert [f for f in run_check(CheckOptions(target=str(script))).findings
            if f.rule == "zero-learning-rate"] == []
