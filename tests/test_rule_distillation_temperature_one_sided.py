"""distillation-temperature-one-sided (GD327): the distillation losses
analysis/distill_temperature.py reads as softening one side only, and the rule over a trace's
backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.distill_temperature import one_sided_temperatures


def _read(tmp_path, text):
    path = tmp_path / "kd.py"
    path.write_text(dedent(text))
    return [(line, side, divisor, value) for line, side, _, _, divisor, value in one_sided_temperatures(str(path))]


@pytest.mark.parametrize("text, found", [
    ("T = 4.0\nl = F.kl_div(F.log_softmax(s, dim=1), F.softmax(t / T, dim=1), reduction='batchmean')\n",
     [(2, "student", "T", 4.0)]),
    ("l = kl(F.log_softmax(s / 2, 1), F.softmax(t, 1))\n", [(1, "teacher", "2", 2.0)]),
    ("T, alpha = 3, 0.5\npt = F.softmax(t / T, -1)\nl = -(pt * F.log_softmax(s, -1)).sum(-1).mean()\n",
     [(3, "student", "T", 3.0)]),
    ("def kd(s, t, temperature=5.0):\n    return criterion(s.log_softmax(1), (t / temperature).softmax(1))\n",
     [(2, "student", "temperature", 5.0)]),
    ("l = F.kl_div(torch.log_softmax(s, 1), torch.softmax(t / args.T, 1))\n",
     [(1, "student", "args.T", None)]),  # unknown value, named as a distillation temperature
])
def test_a_temperature_on_one_side_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "T = 4.0\nl = F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t / T, dim=1))\n",
    "l = F.kl_div(F.log_softmax(s, dim=1), F.softmax(t, dim=1))\n",  # T = 1, mutual learning
    "l = -(F.softmax(t / 0.04, -1) * F.log_softmax(s / 0.1, -1)).sum(-1)\n",  # DINO's two temperatures
    "tmp = 0.4\nl = F.kl_div(F.log_softmax(s, -1), F.softmax(t / tmp, -1))\n",  # UDA sharpening
    "l = F.kl_div(F.log_softmax(s, -1), F.softmax(t / args.uda_softmax_temp, -1))\n",  # unknown, sharpening
    "l = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True)\n",
    "p = F.softmax(logits / T, 1)\nloss = F.cross_entropy(logits, y)\n",  # no pair
])
def test_both_sides_neither_side_and_sharpened_targets_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "kd.py"
    script.write_text("T = 4.0\nl = F.kl_div(F.log_softmax(s, dim=1), F.softmax(t / T, dim=1))\n")
    rule = find_rule("distillation-temperature-one-sided")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [(f.location.line, f.evidence["side"]) for f in found] == [(2, "student")]
    assert "s / T" in found[0].fix
