"""analysis/lr.py: the lr timeline (per optimizer and param group, the lr at each step and
what wrote it) and the scheduler facts, on hand-written traces and one real run."""

from __future__ import annotations

import os
import textwrap

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from lr_traces import sched_init, sched_step, update
from rule_traces import P
from graddoctor.trace import TraceBuilder


def test_each_step_names_the_writer_of_the_lr_it_applies():
    t = TraceBuilder()
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=P, lrs=[0.1]), 2)
    update(t, lr=0.1)                                  # as constructed
    sched_init(t, cls="LinearLR", lrs=(0.01,), base=(0.1,), line=5)
    update(t, lr=0.01)                                 # the scheduler's construction
    sched_step(t, cls="LinearLR", lrs=[0.05], line=30)
    update(t, lr=0.05)                                 # its step
    update(t, lr=0.2)                                  # nobody recorded: the script's own write
    points = Analysis(t.trace).lr_timeline[0][0]
    assert [p.step for p in points] == [1, 2, 3, 4]
    assert [p.lr for p in points] == [0.1, 0.01, 0.05, 0.2]
    kinds = [(p.writer.kind, p.writer.call, p.writer.loc.line if p.writer.loc else None) for p in points]
    assert kinds == [("optimizer", None, 2), ("scheduler", "init", 5), ("scheduler", "step", 30),
                     ("manual", None, None)]
    assert points[1].writer.cls == "LinearLR"


def test_a_real_run_records_groups_schedulers_and_the_manual_write_line(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.5}], lr=0.1)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=4)
        for it in range(6):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            sched.step()
            if it == 3:
                opt.param_groups[1]["lr"] = 0.01
        """))
    import graddoctor

    monkeypatch.chdir(tmp_path)
    report = graddoctor.check_script(os.fspath(script))
    a = report.analysis
    timeline = a.lr_timeline
    (opt,) = timeline
    weight, bias = timeline[opt][0], timeline[opt][1]
    assert [round(p.lr, 4) for p in weight] == [0.05, 0.0625, 0.075, 0.0875, 0.1, 0.1]
    assert bias[0].writer.kind == "scheduler" and bias[0].writer.args["start_factor"] == 0.5
    manual = bias[4]  # step 5: the first after the script's write (LinearLR's next step keeps it)
    assert manual.lr == 0.01 and manual.writer.kind == "manual" and manual.writer.loc.line == 12
    assert bias[5].writer.kind == "scheduler" and bias[3].writer.kind == "scheduler"
    (s,) = a.schedulers.values()
    assert (s.cls, s.count, s.first_factor) == ("LinearLR", 6, 0.5)
