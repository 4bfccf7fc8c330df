"""A run has one owner: every front door enters a ``Session`` (graddoctor/run/session.py), the
status is decided in ``status.decide_status`` alone, and the ``Report`` it builds is frozen."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import runpy

import pytest
from typer.testing import CliRunner

import graddoctor
from graddoctor.cli import app
from graddoctor.run import session as session_module
from graddoctor.status import (BackwardLimitReached, ReplayTimeout, RunStatus, ScriptExit,
                               StepLimitReached, StopReplay, Unfinished, decide_status)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "graddoctor")
SCRIPT = os.path.join(ROOT, "examples", "buggy_train.py")


@pytest.mark.parametrize("ended_by, stop_raised, trained, parts, expected", [
    (None, None, True, (), RunStatus.COMPLETED),
    (None, None, False, (), RunStatus.NO_TRAINING_LOOP),
    (SystemExit(0), None, True, (), RunStatus.COMPLETED),
    (SystemExit(None), None, False, (), RunStatus.NO_TRAINING_LOOP),
    (ScriptExit(0), None, True, (), RunStatus.COMPLETED),
    (SystemExit(3), None, True, (), RunStatus.CRASHED),
    (SystemExit("bye"), None, True, (), RunStatus.CRASHED),
    (ScriptExit(1), None, True, (), RunStatus.CRASHED),
    (ValueError("boom"), None, True, (), RunStatus.CRASHED),
    (KeyboardInterrupt(), None, False, (), RunStatus.CRASHED),
    (Unfinished(), None, True, (), RunStatus.CRASHED),
    (StepLimitReached(), None, True, (), RunStatus.STEP_LIMIT),
    (StopReplay(), None, True, (), RunStatus.STEP_LIMIT),
    (BackwardLimitReached(), None, True, (), RunStatus.BACKWARD_LIMIT),
    (ReplayTimeout(), None, False, (), RunStatus.TIMEOUT),
    # a stop raised in another thread while the main thread returned: the replay was cut
    (None, "step-limit", True, (), RunStatus.STEP_LIMIT),
    (SystemExit(0), "backward-limit", True, (), RunStatus.BACKWARD_LIMIT),
    (ValueError("boom"), "step-limit", True, (), RunStatus.CRASHED),
    # merged processes: the worst of those that trained; a lost process makes it crashed
    (None, None, True, ("completed", "step-limit"), RunStatus.STEP_LIMIT),
    (None, None, True, ("no-training-loop", "completed"), RunStatus.COMPLETED),
    (None, None, True, ("no-training-loop", "no-training-loop"), RunStatus.NO_TRAINING_LOOP),
    (None, None, True, ("completed", "missing", "timeout"), RunStatus.CRASHED),
    (None, None, True, ("timeout", "crashed"), RunStatus.CRASHED),
])
def test_the_status_of_every_way_a_run_ends(ended_by, stop_raised, trained, parts, expected):
    status = decide_status(ended_by, stop_raised=stop_raised, trained=trained, parts=parts)
    assert status is expected


def test_statuses_are_their_json_strings():
    assert json.dumps({"status": RunStatus.NO_TRAINING_LOOP}) == '{"status": "no-training-loop"}'
    assert f"{RunStatus.STEP_LIMIT}" == str(RunStatus.STEP_LIMIT) == "step-limit"
    assert {"crashed": 1}.get(RunStatus.CRASHED) == 1
    with open(os.path.join(PACKAGE, "report", "report.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)["$defs"]
    assert schema["rank"]["properties"]["status"]["enum"] == [s.value for s in RunStatus]
    assert schema["run"]["properties"]["status"]["enum"] == \
        [s.value for s in RunStatus if s is not RunStatus.MISSING]


def _status_literals(tree: ast.AST):
    """Places that set a status from a literal: ``x.status = ...``, ``status="crashed"``,
    ``{"status": "missing"}``."""
    values = {s.value for s in RunStatus}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == "status":
                        yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.keyword) and node.arg == "status" and \
                isinstance(node.value, ast.Constant) and node.value.value in values:
            yield node.value.lineno, ast.unparse(node)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "status" and \
                        isinstance(value, ast.Constant) and value.value in values:
                    yield key.lineno, ast.unparse(node)[:80]


def test_no_module_but_status_py_sets_a_run_status():
    """The status is decided in one function: no other module assigns one."""
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == os.path.join(PACKAGE, "status.py"):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            found += [f"{os.path.relpath(path, ROOT)}:{line}: {text}"
                      for line, text in _status_literals(tree)]
    assert found == []


def test_a_built_report_is_frozen():
    report = graddoctor.check_script(SCRIPT, steps=3, config=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.run.status = RunStatus.CRASHED
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.fail_on = "never"
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.analysis = None


def _comparable(report) -> dict:
    """What a report says about the run, without what depends on the front door's label."""
    data = report.to_json()
    run = data["run"]
    return {"status": run["status"], "steps": run["steps"], "error": run["error"],
            "backward_calls": run["backward_calls"], "fail_on": report.fail_on,
            "findings": [(f["code"], f["location"]["line"] if f.get("location") else None,
                          f["message"]) for f in data["findings"]]}


@pytest.fixture
def sessions(monkeypatch):
    """The sessions entered (and the reports they built) while the test runs."""
    entered = []
    init = session_module.Session.__init__

    def spy(self, options, **kwargs):
        entered.append(options.target)
        init(self, options, **kwargs)

    monkeypatch.setattr(session_module.Session, "__init__", spy)
    return entered


def test_every_front_door_enters_a_session_and_gets_the_same_report(tmp_path, monkeypatch,
                                                                     sessions):
    monkeypatch.chdir(tmp_path)
    # watch() leaves the epoch-end checks off (a block may not loop over epochs): so do these
    checked = graddoctor.check_script(SCRIPT, steps=4, epoch_batches=0, fail_on="error",
                                      config=False)
    assert sessions == [SCRIPT]

    result = CliRunner().invoke(app, ["check", SCRIPT, "--steps", "4", "--epoch-batches", "0",
                                      "--fail-on", "error", "--format", "json", "-o", "r.json"])
    assert result.exit_code == checked.exit_code() == 1, result.output
    assert sessions == [SCRIPT, SCRIPT]
    from graddoctor.report.json_format import from_dict

    with open("r.json", encoding="utf-8") as f:
        from_cli = dataclasses.replace(from_dict(json.load(f)), fail_on="error")

    with graddoctor.watch(steps=4, fail_on="error") as w:
        runpy.run_path(SCRIPT, run_name="__main__")
    assert len(sessions) == 3 and sessions[2].startswith("watch() at ")

    assert _comparable(checked)["findings"], "the fixture has a bug to find"
    assert _comparable(checked) == _comparable(from_cli) == _comparable(w.report)
    assert w.report.run.status is checked.run.status is RunStatus.STEP_LIMIT


def test_a_cell_error_ends_the_watch_as_a_crash():
    """The notebook magic hands the error IPython already showed to the watch (no status is
    rewritten afterwards)."""
    w = graddoctor.watch()
    with w:
        try:
            raise ValueError("in a cell")
        except ValueError as error:
            w.failed_with(error)
    assert w.report.run.status is RunStatus.CRASHED
    assert w.report.run.error["type"] == "ValueError"
    assert w.report.run.error["message"] == "in a cell"


def test_one_at_fork_handler():
    """One ``os.register_at_fork`` in the package (run/atfork.py): the parts of a run say
    there what a forked child undoes."""
    calls = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            calls += [os.path.relpath(path, PACKAGE) for node in ast.walk(tree)
                      if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.register_at_fork"]
    assert calls == [os.path.join("run", "atfork.py")]
