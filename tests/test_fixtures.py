"""Every fixture script checked in-process through the library (``run_check``); its findings
must match its marks (tests/fixture_marks.py): each ``# expect:`` mark met at its line by its
slug at its severity, no unmarked warning or error anywhere, and on a good fixture no unmarked
finding at all and nothing from the rules it declares ``# silent:``. Its trace is then folded
from the first turn on and analysed again: the same findings and notes, whatever a long run
folds. The fixtures of tests/watch_parity.py's subset (for every rule a bad fixture that
expects it and a good fixture that silences it, and every fixture whose run goes through what
differs between the two doors: threads, frameworks, GPU emulation, ...) also run a second time
under the in-process API, ``graddoctor.watch()``, which must find exactly the same. The CLI's
own path is covered by tests/test_end_to_end.py and the CLI tests."""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import builtins
import contextlib
import sys
import types
import re
import threading

import pytest
import typer

from conftest import FIXTURES
from fixture_marks import Seen, compare, read_marks, read_silent
from fixture_runs import check_fixture
from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze, selected_rules
from graddoctor.run.session import run_check
from graddoctor.cli import app
from graddoctor import watch
from graddoctor.options import SCRIPT_OPTIONS, WATCH_OPTIONS, CheckOptions, resolve
from graddoctor.run.process_state import ProcessState
from graddoctor.status import StopReplay
from graddoctor.report.json_format import finding_to_dict, render
from graddoctor.rules.notes import run_notes
from graddoctor.suppress import apply_suppressions
from rule_traces import fold_hard
from watch_parity import fixture_marks, uncovered, watch_subset
from wire_round_trip import assert_round_trip

# fixtures/ddp/ need two ranks: tests/test_distributed.py runs them in one 2-rank launch
DDP_FIXTURES = os.path.join(FIXTURES, "ddp")
FIXTURE_FILES = sorted(p for p in glob.glob(os.path.join(FIXTURES, "**", "*.py"), recursive=True)
                       if not p.startswith(DDP_FIXTURES + os.sep))


@functools.cache
def _check_command():
    """The CLI's ``check`` command as click sees it: built from the typer app once (~10 ms a
    build, once per fixture before), then only asked to parse."""
    return typer.main.get_command(app).commands["check"]


def options_for(name: str, cli_args: list[str]) -> CheckOptions:
    """The CheckOptions that ``graddoctor check NAME CLI_ARGS`` would run with (parsed by the
    CLI's own option parser; the fixture folders have no [tool.graddoctor] to merge)."""
    with _check_command().make_context("check", [name, *cli_args]) as ctx:
        p = ctx.params
    values = {name: p[name] for name in SCRIPT_OPTIONS}
    return resolve(name, p["script_args"] or (), values, values, source="library",
                   use_config=False).options


def test_there_are_fixtures():
    assert len(FIXTURE_FILES) >= 20


@functools.cache
def watched_fixtures() -> dict[str, str]:
    """The fixtures also run under ``watch()`` (tests/watch_parity.py), each with why."""
    return watch_subset(FIXTURE_FILES)


def test_watch_subset_covers_every_rule():
    assert not uncovered(FIXTURE_FILES, watched_fixtures())
    assert len(watched_fixtures()) < len(FIXTURE_FILES)  # a subset, the point of it


def test_watch_subset_is_the_same_whatever_the_order():
    assert watch_subset(FIXTURE_FILES[::-1]) == watched_fixtures()


def test_uncovered_names_a_rule_or_an_area_left_out():
    chosen = watched_fixtures()
    expects = {}
    for path in chosen:
        for slug in fixture_marks(path).expects:
            expects.setdefault(slug, []).append(path)
    slug = sorted(expects)[0]
    # every fixture that expects the rule left out: the subset no longer covers it
    without = [p for p in chosen if slug not in fixture_marks(p).expects]
    assert f"no fixture run under watch() expects {slug}" in uncovered(FIXTURE_FILES, without)
    silences = sorted({s for p in chosen for s in fixture_marks(p).silences})[0]
    without = [p for p in chosen if silences not in fixture_marks(p).silences]
    assert f"no fixture run under watch() silences {silences}" in uncovered(FIXTURE_FILES, without)
    threads = [p for p in FIXTURE_FILES if os.sep + "threads" + os.sep in p]
    assert threads and all(p in chosen for p in threads)
    without = [p for p in chosen if p != threads[0]]
    assert any(m.startswith(f"{threads[0]} is not run under watch()")
               for m in uncovered(FIXTURE_FILES, without))


def test_options_for_reads_the_fixture_args():
    options = options_for("x.py", ["--steps", "0", "--epoch-batches", "5"])
    assert (options.target, options.steps, options.epoch_batches) == ("x.py", 0, 5)
    assert options_for("x.py", []) == CheckOptions(target="x.py")


FRAMEWORKS = ("lightning", "accelerate", "transformers")


def frameworks_needed(path: str) -> list[str]:
    """The training frameworks a fixture imports (fixtures/frameworks/: skipped where one is not
    installed; CI installs them, graddoctor[frameworks])."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    needed = [name for name in FRAMEWORKS if re.search(rf"^\s*(import|from) {name}\b", text, re.M)]
    if "transformers" in needed and "accelerate" not in needed:
        needed.append("accelerate")  # the Trainer runs on accelerate
    return needed


def reset_accelerate_state():
    """accelerate keeps one process-wide state (the Trainer makes an Accelerator too): a fixture
    run in-process after another must start from a fresh one, as `graddoctor check` does."""
    if importlib.util.find_spec("accelerate") is None:
        return
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@contextlib.contextmanager
def script_threads_end_unchanged():
    """The exceptions that ended a thread of the script other than graddoctor's own stop
    (``StopReplay``, raised at a safe point to end the replay): a fixture's threads end
    cleanly when run plain, so any such exception is graddoctor changing the script's run."""
    raised: list[str] = []
    previous = threading.excepthook

    def hook(args):
        if not isinstance(args.exc_value, StopReplay):
            raised.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: "
                          f"{args.exc_value}")
        previous(args)

    threading.excepthook = hook
    try:
        yield raised
    finally:
        threading.excepthook = previous


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_fixture(path, monkeypatch):
    with script_threads_end_unchanged() as raised:
        check_one_fixture(path, monkeypatch)
    assert not raised, raised


def check_one_fixture(path, monkeypatch):
    for name in frameworks_needed(path):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install graddoctor[frameworks])")
    if frameworks_needed(path):
        reset_accelerate_state()
    expectations, extra_args = read_marks(path)
    name = os.path.basename(path)
    options = options_for(name, extra_args)
    silent = None
    if name.startswith("good_"):
        silent = read_silent(path)
        unselected = silent - {r.slug for r in selected_rules(options.select, options.ignore)}
        assert not unselected, f"declared silent, yet not selected by its options: {unselected}"
        assert all(sev == "info" for e in expectations for _, sev in e.alternatives), \
            "a good fixture marks only the info findings it is meant to get"
    else:
        assert name.startswith("bad_"), "fixtures are named good_*.py or bad_*.py"
        assert expectations, "buggy fixtures must mark the lines findings point at"
    monkeypatch.chdir(os.path.dirname(path))  # as `cd fixtures/...; graddoctor check NAME`
    report = check_fixture(path, options)  # tests/test_fixes.py reads the same run
    assert report.run.status in ("completed", "step-limit"), report.run
    assert not report.internal_errors, report.internal_errors
    assert_round_trip(report)  # what a rank or worker would hand over, read back whole
    found = [Seen(f.location.path if f.location else None, f.location.line if f.location else None,
                  f.rule, f.severity.value) for f in report.findings]
    problems = compare(expectations, found, name, silent)
    if frameworks_needed(path):  # every finding and related line is one the user wrote
        for f in report.findings:
            for loc in [f.location, *(r.location for r in f.related)]:
                if loc is not None and ("site-packages" in loc.path or "dist-packages" in loc.path):
                    problems.append(f"{f.rule} points inside a library: {loc}")
    assert not problems, "\n".join(problems) + "\n" + json.dumps(
        json.loads(render(report))["findings"], indent=1)[:4000]
    if silent is not None:  # a clean loop gets no edit, whatever it is told (info included)
        assert not [f for f in report.findings if f.autofix and f.autofix.edits], \
            [(f.rule, f.autofix) for f in report.findings if f.autofix]
    assert_folding_changes_nothing(report, options)
    if path not in watched_fixtures():
        return
    # the in-process API, graddoctor.watch() around the same script, finds exactly the same
    watched = watch_script(name, report_options(options), monkeypatch)
    assert watched.run.status == report.run.status, watched.run
    assert not watched.internal_errors, watched.internal_errors
    assert [finding_to_dict(f) for f in watched.findings] == \
        [finding_to_dict(f) for f in report.findings]


def assert_folding_changes_nothing(report, options: CheckOptions) -> None:
    """The run's trace folded as hard as the recorder can fold it (from the first turn on, see
    tests/rule_traces.py) gives the same findings, to the last field, and the same notes: rules
    count what happened, not what the trace kept."""
    folded = Analysis(fold_hard(report.analysis.trace))
    findings, errors = analyze(folded, selected_rules(options.select, options.ignore))
    assert not errors, errors
    findings = apply_suppressions(findings, report.base_dir)
    assert [finding_to_dict(f) for f in findings] == [finding_to_dict(f) for f in report.findings]
    assert run_notes(folded) == run_notes(report.analysis)
    assert folded.step_count == report.analysis.step_count
    assert folded.backward_calls == report.analysis.backward_calls


def report_options(options: CheckOptions) -> dict:
    """The watch() options of a check's options (every option of watch is one of check's)."""
    return {name: getattr(options, o.field) for name, o in WATCH_OPTIONS.items()}


# the ``with`` statement runs in the script's own namespace, as in a script whose module-level
# code is ``with graddoctor.watch(): <the script's code>`` (its variables name the parameters)
DRIVER = "def _graddoctor_driver(w, code):\n    with w:\n        exec(code, globals())\n"


def watch_script(name: str, options: dict, monkeypatch):
    """The script's code run under ``with graddoctor.watch(**options):`` as ``__main__`` (like
    ``python NAME``); the interpreter state it changes is put back as the CLI's runner does."""
    path = os.path.abspath(name)
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    state = ProcessState()
    monkeypatch.setattr(sys, "argv", [name])
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    w = watch(**options)
    try:
        exec(compile(DRIVER, path, "exec"), main.__dict__)
        main.__dict__.pop("_graddoctor_driver")(w, code)
    finally:
        state.restore()
    return w.report


def test_a_script_thread_ended_by_anything_but_graddoctors_stop_is_told():
    from graddoctor.status import StepLimitReached

    def crash():
        raise TypeError("norm() got an unexpected keyword argument")

    def stopped():
        raise StepLimitReached("stopped after 10 updates")

    with script_threads_end_unchanged() as raised:
        for target in (crash, stopped):
            thread = threading.Thread(target=target, name=target.__name__)
            thread.start()
            thread.join()
    assert raised == ["crash: TypeError: norm() got an unexpected keyword argument"]
