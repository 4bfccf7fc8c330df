"""lr-schedule-skips-groups (GD195): small scripts run in process, each writing its lrs by hand."""

from __future__ import annotations

import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "lr-schedule-skips-groups"

SCRIPT = """\
import torch
a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD([{{"params": a.parameters(), "lr": 0.1}},
                             {{"params": b.parameters(), "lr": {second}}}])
for step in range(6):
    factor = 0.8 ** step
{write}
    loss = b(torch.relu(a(torch.randn(8, 4)))).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _check(tmp_path, write, second="0.01"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(write=textwrap.indent(textwrap.dedent(write), "    "), second=second))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_a_schedule_written_into_group_zero_only_is_a_warning_at_its_line(tmp_path):
    (f,) = _check(tmp_path, 'optimizer.param_groups[0]["lr"] = 0.1 * factor')
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert f.evidence["scheduled_group"] == 0 and f.evidence["still_groups"] == [1]
    assert "group 1 (at lr 0.01)" in f.message and "for group, base in zip" in f.fix


@pytest.mark.parametrize("write, second", [
    ('for g, base in zip(optimizer.param_groups, (0.1, 0.01)):\n    g["lr"] = base * factor', "0.01"),
    ('optimizer.param_groups[0]["lr"] = 0.1 * factor', "0.0"),  # the other group frozen at 0
    ('optimizer.param_groups[0]["lr"] = 0.1 * factor\noptimizer.param_groups[1]["lr"] = 0.01 * factor', "0.01"),
    ('optimizer.param_groups[0]["lr"] = 0.1 if step < 4 else 0.05', "0.01"),  # moved once
])
def test_silent_when_every_group_moves_one_is_frozen_or_the_schedule_moved_once(tmp_path, write, second):
    assert _check(tmp_path, write, second) == []
