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
    assert unwatch(owner, "f", first) and _watching(owner.f)[0] == (second,)
    calls.clear()
    assert owner.f(1) == 2 and calls == ["second"]
    assert unwatch(owner, "f", second) and owner.f is original
    assert not unwatch(owner, "f", second)  # no wrapper left


# A focal factor computed from the predictions (instrument/easyweight.py's easy_weighted)

SIGMOID_SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
head = nn.Conv2d(4, 2, 1)
nn.init.constant_(head.bias, -2.0)
opt = torch.optim.SGD(head.parameters(), lr=0.05)
for step in range(4):
    logits = head(torch.randn(4, 4, 8, 8))
    targets = (torch.rand_like(logits) < 0.1).float()
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = {loss}
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _check_sigmoid(tmp_path, loss):
    script = tmp_path / "train.py"
    script.write_text(SIGMOID_SCRIPT.format(loss=loss))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


@pytest.mark.parametrize("loss", [
    "(ce * p_t ** 2).sum() / 10",                       # the factor written with p_t
    "(0.25 * ce * (1 - (1 - p_t)) ** 2).mean()",        # an alpha before, p_t from the wrong side
])
def test_a_focal_factor_from_the_predictions_that_falls_with_the_loss_is_a_warning(tmp_path, loss):
    (f,) = _check_sigmoid(tmp_path, loss)
    assert f.severity is Severity.WARNING and f.location.line == 15
    assert f.evidence["fn"] == "binary_cross_entropy_with_logits"
    assert f.evidence["rho"] < -0.9 and f.evidence["groups"] >= 1
    assert f.related and f.related[0].location.line == 17  # the backward


@pytest.mark.parametrize("loss", [
    "(ce * (1 - p_t) ** 2).sum() / 10",                 # torchvision's focal loss
    "(ce * p_t.detach() ** 2).sum() / 10",              # a detached weight: meant as a constant
    "(ce * (0.25 * targets + 0.75 * (1 - targets))).mean()",  # a per-class alpha only
    "(ce * (p > 0.5).float()).mean()",                  # a 0/1 mask
])
def test_focal_factors_that_grow_with_the_loss_and_constant_weights_stay_silent(tmp_path, loss):
    assert _check_sigmoid(tmp_path, loss) == []


def test_the_correlation_is_taken_within_each_target_value():
    import torch

    from graddoctor.instrument.easyweight import weight_loss_correlation

    loss = torch.linspace(0.1, 3.0, 64, dtype=torch.float64)
    target = torch.zeros(64)
    target[::2] = 1
    rho, groups, size = weight_loss_correlation(torch.exp(-loss) ** 2, loss, target)
    assert rho == pytest.approx(-1.0) and groups == 2 and size == 64
    rho, _, _ = weight_loss_correlation((1 - torch.exp(-loss)) ** 2, loss, target)
    assert rho == pytest.approx(1.0)
    # a weight set by the target alone is constant within each group: nothing to rank
    assert weight_loss_correlation(0.25 * target + 0.75 * (1 - target), loss, target) is None
    # groups smaller than 16 elements are not ranked
    assert weight_loss_correlation(torch.exp(-loss), loss, torch.arange(64)) is None


def test_weighting_lines_finds_the_multiplication_of_an_unreduced_loss():
    from graddoctor.rules.hard_samples_pushed_up import weighting_lines

    tree = ast.parse(textwrap.dedent("""\
        def focal(x, t):
            ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
            p_t = torch.sigmoid(x)
            loss = ce * p_t ** 2
            return loss.sum()
        def plain(x, t):
            ce = F.binary_cross_entropy_with_logits(x, t)
            return ce * 2
        """))
    assert weighting_lines(tree) == [(4, "loss = ce * p_t ** 2")]
