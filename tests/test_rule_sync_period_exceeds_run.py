"""sync-period-exceeds-run (GD378): the source search for a model copy synced under a period the
planned run never reaches, and the rule over a trace."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.sync_period_exceeds_run import periods_beyond_run
from graddoctor.trace import TraceBuilder

SLUG = "sync-period-exceeds-run"
SYNC = "        target.load_state_dict(net.state_dict())\n"


def _found(src: str):
    return [(h["line"], h["period"], h["largest"]) for h in periods_beyond_run(ast.parse(src))]


def test_a_period_beyond_the_loop_is_found_at_the_if():
    assert _found("for step in range(5000):\n    if step % 10000 == 0:\n" + SYNC) == [(2, 10000, 4999)]
    assert _found("N = 2_000\nK = 2 * 1250\nfor it in range(N):\n    if (it + 1) % K == 0:\n" + SYNC) \
        == [(4, 2500, 2000)]
    assert _found("n = 0\nfor ep in range(50):\n    for t in range(100):\n        n += 1\n"
                  "        if n % 8000 == 0:\n            sync_target(target, net)\n") == [(5, 8000, 5000)]
    assert _found("for step in range(1, 901):\n    if step % int(1e3) == 0:\n"
                  "        for tp, p in zip(a, b):\n            tp.data.copy_(p.data)\n") == [(2, 1000, 900)]


def test_periods_the_run_reaches_or_cannot_be_read_stay_silent():
    for src in (
        "for step in range(50000):\n    if step % 10000 == 0:\n" + SYNC,
        "for step in range(5000):\n    if step % 10000 == 0:\n        print(step)\n",  # no copy
        "for step in range(args.steps):\n    if step % 10000 == 0:\n" + SYNC,
        "for step in range(5000):\n    if step % args.sync == 0:\n" + SYNC,
        "n = 0\nwhile True:\n    n += 1\n    if n % 8000 == 0:\n" + SYNC,
        "n = 0\nfor t in range(100):\n    n += 1\n    n += 1\n    if n % 150 == 0:\n" + SYNC,
        "K = 10\nK = 10000\nfor step in range(5000):\n    if step % K == 0:\n" + SYNC,  # bound twice
        "for epoch in range(10):\n    for step in range(100):\n        if step % 20 == 0:\n    " + SYNC,
        "for step in range(5000):\n    if step % 10000 == 1:\n" + SYNC,
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_if(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("for step in range(5000):\n    loss.backward()\n    if step % 10000 == 0:\n" + SYNC)
    t = TraceBuilder(str(script))
    t.backward(line=2)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING and "4999" in found[0].message
