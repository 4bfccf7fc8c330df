"""decay-passes-zero (GD282): the source search for linear decays of a loop's counter sized
shorter than the loop, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.decay_passes_zero import decays_past_zero
from graddoctor.trace import TraceBuilder

SLUG = "decay-passes-zero"


def _found(src: str):
    return [(h["line"], h["why"]) for h in decays_past_zero(ast.parse(src))]


def test_decays_the_loop_runs_past_are_found():
    assert _found("EPOCHS = 10\nspe = int(n / EPOCHS)\ntotal = spe * EPOCHS\n"
                  "for step in range(total):\n    w = 0.5 * (1 - step / EPOCHS)\n") == [(5, "factor")]
    assert _found("M = 30\nfor it in range(50):\n    lr = 0.1 * (1 - it / M)\n") == [(3, "values")]
    assert _found("for it in range(n_iters):\n    w = 2.0 * (n_epochs - it) / n_epochs\n") == [(2, "unit")]


def test_right_decays_stay_silent():
    for src in (
        "for epoch in range(EPOCHS):\n    w = 1 - epoch / EPOCHS\n",
        "for it in range(total):\n    w = 1 - it / total\n",
        "for it in range(total):\n    w = max(0.0, 1 - it / WARM)\n",
        "for it in range(total):\n    w = 1 - it / WARM\n    w = max(w, 0.0)\n",
        "for it in range(50):\n    w = 1 - it / 100\n",
        "M = 60\nfor it in range(50):\n    w = 1 - it / M\n",
        "for it in range(total):\n    if 1 - it / WARM > 0:\n        pass\n",
        "for it in range(n):\n    w = 1 - it / m\n",
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_decay(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("M = 10\n"
                      "for it in range(40):\n"
                      "    w = 1 - it / M\n"
                      "    loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
    assert "max(0.0, 1 - it / M)" in found[0].fix
