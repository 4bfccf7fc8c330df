"""Hand-made reports and small training scripts for the report, config and suppression tests."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap

from graddoctor.analysis import Analysis
from graddoctor.findings import Autofix, Edit, Finding, Related, Safety, Severity
from graddoctor.report.model import Report, RunInfo
from graddoctor.trace import Location, TraceBuilder

# A script whose lines the hand-made report points at (excerpts are read from disk).
SOURCE = textwrap.dedent('''\
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        scheduler.step()
''')


def sample_report(folder: str, *, suppressed: bool = True, status: str = "step-limit") -> Report:
    """A report over ``folder/train.py``: one error, one warning, one info, one suppressed."""
    path = os.path.join(folder, "train.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(SOURCE)
    t = TraceBuilder(path)
    t.param(0, "model.fc1.weight")
    t.param(1, "model.fc1.bias")
    t.param(2, "model.head.weight")
    t.optimizer(0, [0, 1, 2], line=1, cls="AdamW")
    for epoch in range(2):
        t.event("epoch_start", line=2, loader=0, epoch=epoch, real_len=3, replay_len=3)
        for _ in range(2):
            t.clear([0, 1, 2], line=3)
            t.backward(fresh=[0, 1], line=4)
            t.event("bn_forward", line=4, training=True)  # a per-forward detail: not in the timeline
            t.event("step_begin", line=5, opt=0, closure=False, norm_pids=[0, 1],
                    norms=[0.5, 0.25], nonfinite=[])
            t.event("step", line=5, opt=0, closure=False, skipped=False, without_grad=[2])
        t.event("scheduler_step", line=6)
    loc = lambda line: Location(path, line)  # noqa: E731
    findings = [
        Finding("missing-zero-grad", "GD101", Severity.ERROR, "gradients from step 1 are applied again",
                loc(4), fix="call optimizer.zero_grad() once per update",
                related=(Related(loc(5), "the step that applies them"),), step=2,
                evidence={"params": ["model.fc1.weight"]},
                autofix=Autofix("clear optimizer's gradients at the top of the loop", Safety.SAFE,
                                (Edit(path, 3, 0, 3, 0, "    optimizer.zero_grad()\n"),),
                                verification="fixed", digest="0" * 64)),
        Finding("param-without-grad", "GD106", Severity.WARNING, "model.head.weight never gets a gradient",
                loc(1), fix="remove it from the optimizer", step=1),
        Finding("stale-grad", "GD103", Severity.INFO, "worth knowing", None),
    ]
    if suppressed:
        findings.append(Finding("partial-zero-grad", "GD102", Severity.ERROR, "suppressed one", loc(3),
                                fix="clear all", suppressed=True))
    run = RunInfo(script=path, argv=[], status=status, steps=4, backward_calls=4, device="cpu",
                  torch_version="2.13.0+cpu", duration_s=0.25, step_budget=10,
                  error=({"type": "RuntimeError", "message": "boom", "location": {"path": path, "line": 4}}
                         if status == "crashed" else None),
                  notes=["a note"])
    return Report(run=run, findings=findings, internal_errors=[{"where": "rule x", "error": "ValueError"}],
                  analysis=Analysis(t.trace))


NONFINITE_EVIDENCE = {
    "scale": float("inf"),  # a GradScaler that overflowed to inf
    "norms": [float("nan"), float("-inf"), 0.5],
    "steps_by_scale": {float("inf"): 2, float("nan"): 1, 65536.0: 3},  # non-finite keys too
}


def nonfinite_report(folder: str) -> Report:
    """``sample_report`` (crashed) with NaN and ±inf in a finding's evidence."""
    report = sample_report(folder, status="crashed")
    first = report.findings[0]
    report.findings[0] = dataclasses.replace(first, evidence={**first.evidence, **NONFINITE_EVIDENCE})
    return report


def strict_json(text: str):
    """``json.loads`` that refuses NaN / Infinity / -Infinity (as JavaScript, jq and code-scanning
    uploads do)."""
    def reject(constant):
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=reject)


# Real scripts, tiny and seeded (run in-process through the CLI).
MISSING_ZERO_GRAD = textwrap.dedent('''\
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    for epoch in range(10):
        loss = F.mse_loss(model(x), y)
        loss.backward(){comment}
        optimizer.step()
''')
MISSING_ZERO_GRAD_LINE = 12

UNUSED_LAYER = textwrap.dedent('''\
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    used, unused = nn.Linear(8, 1), nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*used.parameters(), *unused.parameters()], lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    for epoch in range(10):
        optimizer.zero_grad()
        F.mse_loss(used(x), y).backward()
        optimizer.step()
''')
UNUSED_LAYER_LINE = 7  # param-without-grad (warning) points at the optimizer

CLEAN = textwrap.dedent('''\
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for epoch in range(20):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    print("done")
''')

CRASH = textwrap.dedent('''\
    import torch
    raise RuntimeError("data folder missing")
''')


def write(folder, name: str, text: str, comment: str = "") -> str:
    path = os.path.join(str(folder), name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace("{comment}", comment))
    return path
