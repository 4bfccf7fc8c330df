"""normaliser-fed-normalised (GD299): the updates analysis/normaliser_feedback.py reads as a
running normaliser fed its own output, and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.normaliser_feedback import normaliser_fed_own_output


def _read(tmp_path, text):
    path = tmp_path / "norm.py"
    path.write_text(dedent(text))
    return [(line, owner, made) for line, _, owner, made in normaliser_fed_own_output(str(path))]


@pytest.mark.parametrize("text, found", [
    ("n = ((o - rms.mean) / (rms.var.sqrt() + 1e-8)).clamp(-5, 5)\nrms.update(n.reshape(-1, 4))\n",
     [(2, "rms", 1)]),
    ("def f(self, x):\n    y = self.rms.normalize(x)\n    self.rms.update(y)\n", [(3, "self.rms", 2)]),
    ("stats.update((x - stats.mean) / stats.std)\n", [(1, "stats", None)]),
    ("def g(x):\n    x = obs_rms(x)\n    obs_rms.update(x)\n", [(3, "obs_rms", 2)]),
])
def test_an_update_with_the_normalisers_own_output_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "rms.update(obs)\nn = (obs - rms.mean) / rms.var.sqrt()\n",
    "n = rms.normalize(obs)\nrms.update(obs)\n",
    "def h(x):\n    obs_rms.update(x)\n    x = obs_rms(x)\n",
    "z = (x - a.mean) / a.std\nb.update(z)\n",  # another normaliser's statistics
    "d.update({'k': 1})\n",
])
def test_raw_updates_and_other_normalisers_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "norm.py"
    script.write_text("n = (o - rms.mean) / rms.var.sqrt()\nrms.update(n)\n")
    rule = find_rule("normaliser-fed-normalised")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=2)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [2]
    assert "line 1" in found[0].message
