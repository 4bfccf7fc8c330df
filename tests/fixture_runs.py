"""One in-process check (``run_check``) of a script with given options, shared by the tests that
assert different things about the same run: tests/test_fixtures.py (a fixture's findings
against its marks, folding, the wire), tests/test_fixes.py (its edits),
tests/test_trace_immutable.py (every event as it was emitted) and a rule's unit test that
reads a whole fixture run (``check_script``).

A run is found again by what decides it: the script's path and content, the working
directory, the options (every field of ``CheckOptions``) and the ``GRADDOCTOR_*`` environment;
an edited script is checked again. Only for tests that read the report and the script without
changing them, in this process (xdist workers share nothing: a test whose partner ran on the
other worker makes the run itself). A test that patches graddoctor for its own run calls
``run_check`` itself. tests/conftest.py orders the tests that share a run next to each other,
so the second finds the first's run here; only the last few runs are kept, besides those made
for tests known to come later (``keep_for``), held until each is read or the session ends."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable

from graddoctor.options import CheckOptions
from graddoctor.report.model import Report
from graddoctor.run.session import run_check

KEEP = 4  # recent runs kept: each holds a trace the collector and heap scans walk
_runs: OrderedDict[tuple, Report] = OrderedDict()
_held: dict[tuple, list] = {}  # key -> [report, readers still to come]
runs_made = 0  # run_check calls made here
runs_shared = 0  # reports handed to a test from an earlier test's run


def _content(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha1(f.read()).hexdigest()
    except OSError:
        return ""


def key(options: CheckOptions) -> tuple:
    """What decides a run: the script (path and content), where it runs, every option."""
    target = options.target or ""
    path = os.path.abspath(target)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GRADDOCTOR")))
    return (path, _content(path) if os.path.isfile(path) else "", os.getcwd(), repr(options), env)


def checked(options: CheckOptions, *, run: Callable[[CheckOptions], Report] = run_check) -> Report:
    """``run_check(options)`` in the current working directory, or the report of the same run
    made by an earlier test of this process."""
    global runs_made, runs_shared
    k = key(options)
    report = _runs.pop(k, None)
    held = _held.get(k)
    if held is not None:
        held[1] -= 1
        if held[1] <= 0:
            del _held[k]
        report = held[0]
    if report is None:
        runs_made += 1
        report = run(options)
    else:
        runs_shared += 1
    _runs[k] = report
    while len(_runs) > KEEP:
        _runs.popitem(last=False)
    return report


def keep_for(options: CheckOptions, report: Report, readers: int = 1) -> None:
    """Hold ``report`` (a run of ``options`` made in the current working directory) for
    ``readers`` later tests of this process that check the same, however many runs come
    between."""
    _held[key(options)] = [report, readers]


def check_fixture(path: str, options: CheckOptions) -> Report:
    """The fixture at ``path`` checked with ``options`` (the working directory set by the
    caller: the fixture's folder, as `cd fixtures/...; graddoctor check NAME`)."""
    return checked(options)


def fixture_options(path: str, *args: str) -> CheckOptions:
    """The options tests/test_fixtures.py checks the fixture at ``path`` with (its marks'
    arguments, then ``args``), the working directory being the fixture's folder."""
    from fixture_marks import read_marks
    from test_fixtures import options_for

    _, extra = read_marks(path)
    return options_for(os.path.basename(path), [*extra, *args])


def check_script(path: str, *args: str, monkeypatch) -> Report:
    """``cd DIR; graddoctor check NAME ARGS`` in-process for the script at ``path`` (a fixture
    or a test's own file), through the shared runs: a fixture checked with its marks' options
    reads the run its tests/test_fixtures.py test made, when that ran just before."""
    from test_fixtures import options_for

    monkeypatch.chdir(os.path.dirname(os.path.abspath(path)))
    return checked(options_for(os.path.basename(path), list(args)))
