"""Inline ``# graddoctor: ignore[...]``: kept, marked, counted, and out of the exit code."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from graddoctor.findings import Finding, Severity
from graddoctor.suppress import apply_suppressions, read_directives
from graddoctor.trace import Location
from report_samples import MISSING_ZERO_GRAD, MISSING_ZERO_GRAD_LINE, write

runner = CliRunner()


def finding(path, line, rule="missing-zero-grad", code="GD101"):
    return Finding(rule, code, Severity.ERROR, "m", Location(path, line))


def test_directives_are_read_from_comments_only():
    source = (
        'x = 1  # graddoctor: ignore[missing-zero-grad]\n'
        's = "# graddoctor: ignore"\n'
        'y = 2  # GradDoctor:Ignore[GD1, stale-grad]  other words\n'
        'z = 3  # graddoctor: ignore\n'
        'w = 4  # graddoctor: ignored-not-a-directive\n'
    )
    assert read_directives(source) == {1: [("missing-zero-grad",)], 3: [("gd1", "stale-grad")],
                                       4: [None]}


def test_unparsable_source_falls_back_to_line_comments():
    assert read_directives('def f(:\n    pass  # graddoctor: ignore[GD101]\n') == {2: [("gd101",)]}


@pytest.mark.parametrize("comment, suppressed", [
    ("# graddoctor: ignore[missing-zero-grad]", True),
    ("# graddoctor: ignore[GD101]", True),
    ("# graddoctor: ignore[GD1]", True),
    ("# graddoctor: ignore", True),
    ("# graddoctor: ignore[stale-grad, GD101]", True),
    ("# graddoctor: ignore[stale-grad]", False),
    ("# graddoctor: ignore[GD2]", False),
    ("# noqa", False),
])
def test_matching(tmp_path, comment, suppressed):
    path = write(tmp_path, "t.py", f"a = 1\nloss.backward()  {comment}\n")
    f = finding(path, 2)
    assert apply_suppressions([f])[0].suppressed is suppressed
    assert apply_suppressions([finding(path, 1)])[0].suppressed is False  # only the reported line


def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path, "t.py", "x  # graddoctor: ignore\n")
    monkeypatch.chdir(tmp_path)
    assert apply_suppressions([finding("t.py", 1)])[0].suppressed
    assert not apply_suppressions([finding("missing.py", 1)])[0].suppressed


def check(*args):
    return runner.invoke(app, ["check", *args])


def test_suppressed_finding_is_reported_counted_and_does_not_fail(tmp_path):
    script = write(tmp_path, "train.py", MISSING_ZERO_GRAD, "  # graddoctor: ignore[missing-zero-grad]")
    result = check(script, "--format", "json", "--steps", "3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (f,) = report["findings"]
    assert f["rule"] == "missing-zero-grad" and f["suppressed"] is True
    assert f["location"]["line"] == MISSING_ZERO_GRAD_LINE
    assert report["summary"] == {"error": 0, "warning": 0, "info": 0, "suppressed": 1}
    text = check(script, "--steps", "3")
    assert text.exit_code == 0
    assert "1 suppressed" in text.stdout
    assert text.stdout.rstrip().splitlines()[-1].startswith("✓ no gradient bugs found")
    assert text.stdout.rstrip().endswith(", 1 suppressed")


def test_a_suppression_for_another_rule_does_not_hide_it(tmp_path):
    script = write(tmp_path, "train.py", MISSING_ZERO_GRAD, "  # graddoctor: ignore[stale-grad]")
    result = check(script, "--format", "json", "--steps", "3")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["summary"]["suppressed"] == 0
