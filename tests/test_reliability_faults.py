"""Faults in graddoctor itself: recorded as internal errors, never the user's run broken and
never a finding lost; an unwritable --output refused before the script runs."""

from __future__ import annotations

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from graddoctor.run.session import run_check
from graddoctor.options import CheckOptions
from graddoctor.report.json_format import render as render_json
from graddoctor.report.text import render as render_text
from reliability_helpers import MISBEHAVE, SCRIPTS, marked_line, validate

ALL_HOOKS = os.path.join(SCRIPTS, "all_hooks.py")


@pytest.fixture
def scripts_importable(monkeypatch):
    monkeypatch.syspath_prepend(SCRIPTS)
    import keep

    keep.objects.clear()
    yield
    keep.objects.clear()


def _boom(*args, **kwargs):
    raise RuntimeError("graddoctor bug for the test")


def test_a_rule_that_raises_is_an_internal_error_and_the_others_still_run(monkeypatch):
    from graddoctor.rules.stale_grad import StaleGrad

    monkeypatch.setattr(StaleGrad, "check", _boom)
    report = run_check(CheckOptions(target=MISBEHAVE, args=("ok",)))
    assert {"where": "rule stale-grad", "error": "RuntimeError: graddoctor bug for the test"} \
        in report.internal_errors
    assert [(f.rule, f.location.line) for f in report.findings] \
        == [("missing-zero-grad", marked_line(MISBEHAVE))]
    assert report.exit_code("warning") == 1
    data = validate(json.loads(render_json(report)))
    assert data["internal_errors"][0]["where"] == "rule stale-grad"
    assert "internal error in graddoctor (rule stale-grad)" in render_text(report)


def _raise_on(kind):
    from graddoctor.instrument.recorder import Recorder

    original = Recorder.emit

    def emit(self, made, *args, **kwargs):
        if made[0] == kind:  # made: (kind, data), from graddoctor.events
            raise RuntimeError(f"cannot record {made[0]}")
        return original(self, made, *args, **kwargs)

    return emit


# (what raises, how to make it raise, where the internal error is recorded)
FAULTS = [
    ("optimizer_init event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                                   _raise_on("optimizer_init")), "optimizer construction"),
    ("clear event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                          _raise_on("clear")), "zero_grad"),
    ("backward event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                             _raise_on("backward")), "backward (after)"),
    ("step_begin event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                               _raise_on("step_begin")), "optimizer step (before)"),
    ("step event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                         _raise_on("step")), "optimizer step (after)"),
    ("epoch_start event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                                _raise_on("epoch_start")), "DataLoader.__iter__"),
    ("param event", lambda mp: mp.setattr("graddoctor.instrument.recorder.Recorder.emit",
                                          _raise_on("param")), "naming parameters"),
    ("graph walk", lambda mp: mp.setattr("graddoctor.instrument.backward.BackwardWatcher.begin", _boom),
     "backward (before)"),
    ("grad verdict before a backward", lambda mp: mp.setattr(
        "graddoctor.instrument.backward.BackwardWatcher._judge_changed", _boom), "backward (before)"),
    ("gradient pass", lambda mp: mp.setattr("graddoctor.instrument.optim.step_grads", _boom),
     "optimizer step (before)"),
    ("after step", lambda mp: mp.setattr("graddoctor.instrument.gradstate.GradState.after_step", _boom),
     "optimizer step (after)"),
    ("parameter names", lambda mp: mp.setattr("graddoctor.instrument.naming.name_parameters", _boom),
     "naming parameters"),
]


@pytest.mark.parametrize("what, make_it_raise, where", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_hook_that_raises_is_recorded_and_the_run_goes_on(monkeypatch, scripts_importable,
                                                            what, make_it_raise, where):
    make_it_raise(monkeypatch)
    report = run_check(CheckOptions(target=ALL_HOOKS))
    assert (report.run.status, report.run.steps, report.run.error) == ("step-limit", 10, None)
    assert any(where in e["where"] and "RuntimeError" in e["error"] for e in report.internal_errors), \
        report.internal_errors
    import keep

    model = keep.objects[0]
    assert all(p.grad is not None for p in model.parameters())  # the user's training went on
    validate(json.loads(render_json(report)))
    assert "internal error in graddoctor" in render_text(report)


def test_a_failing_hook_is_recorded_a_bounded_number_of_times(monkeypatch, scripts_importable):
    monkeypatch.setattr("graddoctor.instrument.backward.BackwardWatcher._judge_changed", _boom)
    monkeypatch.setattr("graddoctor.instrument.optim.step_grads", _boom)
    report = run_check(CheckOptions(target=ALL_HOOKS, steps=0))
    assert report.run.status == "completed" and report.run.steps == 12
    assert 0 < len(report.internal_errors) <= 20


def test_an_internal_failure_of_the_whole_check_is_one_line(monkeypatch):
    from graddoctor.cli import app

    monkeypatch.setattr("graddoctor.run.session.run_check", _boom)
    result = CliRunner().invoke(app, ["check", MISBEHAVE])
    assert result.exit_code == 2
    assert "graddoctor: error: internal error: RuntimeError: graddoctor bug for the test" in result.output
    assert "Traceback" not in result.output


# -- --output (and --trace) that cannot be written: refused before the script runs ------------
TRAIN = "open('ran.txt', 'w').write('ran')\n"


def _unwritable_paths(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    paths = {
        "missing folder": (str(tmp_path / "missing" / "r.json"), "does not exist"),
        "a directory": (str(tmp_path / "a_folder"), "is a directory"),
        "under a file": (str(tmp_path / "a_file" / "r.json"), "does not exist"),
    }
    if os.path.exists("/proc/version"):  # not writable even for root
        paths["/proc"] = ("/proc/version", "not writable")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
        paths["read-only folder"] = (str(locked / "r.json"), "not writable")
    return paths


@pytest.mark.parametrize("option", ["--output", "--trace"])
def test_unwritable_output_is_refused_before_the_script_runs(tmp_path, option):
    (tmp_path / "train.py").write_text(TRAIN)
    for case, (path, needle) in _unwritable_paths(tmp_path).items():
        result = run_cli("check", "train.py", option, path, cwd=tmp_path)
        assert result.returncode == 2, case
        lines = [line for line in result.stderr.splitlines() if line.startswith("graddoctor: error:")]
        assert len(lines) == 1 and option in lines[0] and needle in lines[0], (case, result.stderr)
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "ran.txt").exists(), f"{case}: the script ran"


def test_output_replaces_an_existing_report_whole(tmp_path):
    """Written to a temporary file and renamed: an existing report (and a symlink to it) is
    replaced by a complete file, never left half-written."""
    (tmp_path / "train.py").write_text("print('no training here')\n")
    target = tmp_path / "old.json"
    target.write_text("x" * 100_000)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = run_cli("check", "train.py", "-f", "json", "-o", "link.json", cwd=tmp_path)
    assert result.returncode == 2  # no training loop: could not check
    assert link.is_symlink()
    report = validate(json.loads(target.read_text()))
    assert report["run"]["status"] == "no-training-loop"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".graddoctor-")]


def test_output_to_a_character_device(tmp_path):
    (tmp_path / "train.py").write_text("print('no training here')\n")
    result = run_cli("check", "train.py", "-f", "json", "-o", "/dev/null", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "no training here\n"  # only the script's
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
