"""Every fixture script through the real CLI; findings must match its ``# expect:`` marks."""

from __future__ import annotations

import glob
import json
import os

import pytest

from conftest import FIXTURES, run_cli
from fixture_marks import compare, read_marks

FIXTURE_FILES = sorted(glob.glob(os.path.join(FIXTURES, "**", "*.py"), recursive=True))


def test_there_are_fixtures():
    assert len(FIXTURE_FILES) >= 20


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_fixture(path):
    expectations, extra_args = read_marks(path)
    name = os.path.basename(path)
    if name.startswith("good_"):
        assert not expectations, "clean fixtures carry no expect marks"
    else:
        assert expectations, "buggy fixtures must mark the lines findings point at"
    result = run_cli("check", name, "--format", "json", "--fail-on", "never", *extra_args,
                     cwd=os.path.dirname(path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["run"]["status"] in ("completed", "step-limit"), report["run"]
    assert not report["internal_errors"], report["internal_errors"]
    found = [(f["location"]["line"], f["rule"], f["severity"]) for f in report["findings"]
             if f["location"] and os.path.basename(f["location"]["path"]) == name]
    problems = compare(expectations, found)
    assert not problems, "\n".join(problems) + "\n" + json.dumps(report["findings"], indent=1)[:4000]
