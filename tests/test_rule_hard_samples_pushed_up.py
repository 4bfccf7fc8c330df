"""hard-samples-pushed-up (GD280): the sign of the gradient a per-sample loss receives, read by
instrument/samplepush.py, and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.rules.hard_samples_pushed_up import combining_line
from graddoctor.run.session import run_check

SLUG = "hard-samples-pushed-up"

SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(6):
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    ce = F.cross_entropy(model(x), y, reduction="none")
    pt = torch.exp(-ce)
    loss = {loss}
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _check(tmp_path, loss):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(loss=loss))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


@pytest.mark.parametrize("loss", [
    "(pt ** 2 * ce).mean()",                      # focal written with pt, not 1 - pt
    "(torch.exp(-ce) * ce).sum()",                # a weight from the loss, attached
    "(torch.softmax(-ce / 0.3, 0) * ce).sum()",   # self-paced soft weights, attached
])
def test_a_loss_falling_in_its_hardest_samples_is_a_warning_where_it_meets_its_weight(tmp_path, loss):
    (f,) = _check(tmp_path, loss)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert f.evidence["fn"] == "cross_entropy" and f.evidence["consumers"] >= 2
    assert f.related and f.related[0].location.line == 10
    assert "(line 10)" in f.message


@pytest.mark.parametrize("loss", [
    "((1 - pt) ** 2 * ce).mean()",                # focal loss
    "(torch.exp(-ce).detach() * ce).mean()",      # a weight meant as a constant
    "ce.mean() + 2.0 * ce.std()",                 # negative only on the easiest samples
    "torch.topk(ce, 8).values.mean()",            # hard-example mining
    "(torch.softmax(ce / 0.3, 0) * ce).sum()",    # worst-case weighting: increasing
    "-ce.mean()",                                 # used once: loss-maximised's to judge
    "(ce * torch.randn(32)).mean()",              # the sign does not follow the loss
])
def test_losses_increasing_in_the_hardest_samples_stay_silent(tmp_path, loss):
    assert _check(tmp_path, loss) == []


def _line(source: str, line: int):
    return combining_line(ast.parse(textwrap.dedent(source)), line)


def test_the_line_where_the_loss_meets_a_value_made_from_it():
    source = """\
    def f(logits, y):
        ce = F.cross_entropy(logits, y, reduction="none")
        pt = torch.exp(-ce)
        w = pt ** 2
        total = ce.mean()
        return (w * ce).mean()
    """
    assert _line(source, 2) == 6  # `total` uses ce once: not the line
    assert _line("loss_i = crit(a, b)\nloss = (loss_i * loss_i.detach()).mean()\n", 1) == 2
    assert _line("loss = crit(a, b).mean()\nprint(loss)\n", 1) is None
    assert _line("crit(a, b)\n", 1) is None


def test_the_wrappers_lose_this_watchers_test_when_its_window_ends():
    import types

    from graddoctor.instrument.inlinable import _watching, unwatch, watched

    calls = []
    owner = types.SimpleNamespace(f=lambda x: x + 1)
    first, second = (lambda args, kwargs: calls.append("first")), (lambda args, kwargs: calls.append("second"))
    original = owner.f
    owner.f = watched(watched(original, first), second)
    assert owner.f(1) == 2 and calls == ["second", "first"]
    assert unwatch(owner, "f", first) and _watching[owner.f][0] == (second,)
    calls.clear()
    assert owner.f(1) == 2 and calls == ["second"]
    assert unwatch(owner, "f", second) and owner.f is original
    assert not unwatch(owner, "f", second)  # no wrapper left
