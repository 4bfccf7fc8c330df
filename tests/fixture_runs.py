"""One in-process check of a fixture (``run_check``), shared by the tests that assert different
things about the same run: tests/test_fixtures.py (its findings against its marks, folding, the
wire) and tests/test_fixes.py (its edits). conftest.py orders a fixture's test_fixes test right
after its test_fixture test, so that on the same worker the second finds the first's run here;
where xdist puts them on different workers, each runs it. Only the last few runs are kept."""

from __future__ import annotations

import os
from collections import OrderedDict

from graddoctor.options import CheckOptions
from graddoctor.report.model import Report
from graddoctor.run.session import run_check

KEEP = 4
_runs: OrderedDict[tuple, Report] = OrderedDict()
runs_made = 0  # run_check calls made here (the tests of this module count them)


def _key(path: str, options: CheckOptions) -> tuple:
    stat = os.stat(path)  # an edited fixture is checked again
    return (os.path.abspath(path), stat.st_mtime_ns, stat.st_size, os.getcwd(), repr(options))


def check_fixture(path: str, options: CheckOptions) -> Report:
    """``run_check(options)`` for the fixture at ``path`` (the working directory set by the
    caller), or the report of the same run made by an earlier test."""
    global runs_made
    key = _key(path, options)
    report = _runs.pop(key, None)
    if report is None:
        runs_made += 1
        report = run_check(options)
    _runs[key] = report
    while len(_runs) > KEEP:
        _runs.popitem(last=False)
    return report
