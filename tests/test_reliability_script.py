"""Whatever the user's script does, graddoctor ends with its status, the findings so far, and a
complete --output file (tests/scripts/misbehave.py: a loop with a missing zero_grad that
misbehaves after three steps)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

from conftest import run_cli
from reliability_helpers import MISBEHAVE, SCRIPTS, check_to_file, findings_at, marked_line

BUG = ("missing-zero-grad", marked_line(MISBEHAVE))


def _line_of(text: str) -> int:
    return marked_line(MISBEHAVE, text)


# mode -> (status, error type, steps, exit code, error line marker or None); a crash after
# some steps is an incomplete check: exit 2 with its findings (--allow-incomplete: by them)
CASES = {
    "ok": ("completed", None, 6, 1, None),
    "raise-before": ("crashed", "RuntimeError", 0, 2, 'raise RuntimeError("failed before any step")'),
    "raise-after": ("crashed", "ValueError", 3, 2, 'raise ValueError("failed after 3 steps")'),
    "unprintable": ("crashed", "Unprintable", 3, 2, "raise Unprintable()"),
    "exit0": ("completed", None, 3, 1, None),
    "exit3": ("crashed", "SystemExit", 3, 2, "sys.exit(3)"),
    "exit-message": ("crashed", "SystemExit", 3, 2, 'sys.exit("bad configuration")'),
    "os-exit": ("completed", None, 3, 1, None),
    "keyboard": ("crashed", "KeyboardInterrupt", 3, 2, "raise KeyboardInterrupt"),
    "catch-all": ("step-limit", None, 10, 1, None),
    "thread": ("completed", None, 6, 1, None),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_status_findings_and_output_file(tmp_path, mode):
    status, error_type, steps, code, error_at = CASES[mode]
    started = time.monotonic()
    result, report = check_to_file(tmp_path, MISBEHAVE, "--", mode, timeout=120)
    run = report["run"]
    assert (run["status"], run["steps"]) == (status, steps), run
    assert result.returncode == code, result.stderr[-2000:]
    # the script's own traceback, as python prints it, and never a frame of graddoctor's
    assert ("Traceback" in result.stderr) == (error_type not in (None, "SystemExit")), result.stderr
    assert '/graddoctor/' not in "".join(l for l in result.stderr.splitlines(True) if l.lstrip().startswith("File "))
    if error_type is None:
        assert run["error"] is None
    else:
        assert run["error"]["type"] == error_type
        assert run["error"]["location"]["line"] == _line_of(error_at)
    if steps >= 2:
        assert BUG in findings_at(report), report["findings"]
    else:
        assert report["findings"] == []
    assert report["internal_errors"] == []
    if mode == "thread":  # the script's endless non-daemon thread must not keep graddoctor alive
        assert time.monotonic() - started < 60


def test_exit_calls_are_noted(tmp_path):
    _, report = check_to_file(tmp_path, MISBEHAVE, "--", "exit0")
    assert any(f"sys.exit(0) at " in note and f":{_line_of('sys.exit(0)')}" in note
               for note in report["run"]["notes"]), report["run"]["notes"]
    _, report = check_to_file(tmp_path, MISBEHAVE, "--", "os-exit")
    assert any("os._exit(0)" in note for note in report["run"]["notes"])
    _, report = check_to_file(tmp_path, MISBEHAVE, "--", "unprintable")
    assert "cannot be shown" in report["run"]["error"]["message"]


def test_crash_reports_the_scripts_traceback(tmp_path):
    _, report = check_to_file(tmp_path, MISBEHAVE, "--", "raise-after")
    tb = report["run"]["error"]["traceback"]
    assert "misbehave()" in tb and "ValueError: failed after 3 steps" in tb
    assert "graddoctor" not in tb and "runpy" not in tb


def test_time_limit_in_a_python_loop(tmp_path):
    result, report = check_to_file(tmp_path, MISBEHAVE, "--timeout", "4", "--", "hang")
    run = report["run"]
    assert run["status"] == "timeout" and run["steps"] == 3
    assert run["error"]["type"] == "Timeout" and "4 s" in run["error"]["message"]
    assert run["error"]["location"]["line"] in (_line_of("while True:"), _line_of("while True:") + 1)
    assert BUG in findings_at(report)
    assert result.returncode == 2  # incomplete
    result, _ = check_to_file(tmp_path, MISBEHAVE, "--timeout", "4", "--allow-incomplete", "--", "hang")
    assert result.returncode == 1  # by the findings


def test_allow_incomplete_exits_by_the_findings(tmp_path):
    result, report = check_to_file(tmp_path, MISBEHAVE, "--allow-incomplete", "--", "raise-after")
    assert report["run"]["status"] == "crashed" and BUG in findings_at(report)
    assert result.returncode == 1, result.stderr[-2000:]


@pytest.mark.parametrize("mode, marker", [
    ("swallow-hang", "time.sleep(0.05)"),  # a bare except catches every stop graddoctor raises
    ("c-hang", "libc.pthread_mutex_lock(mutex)\n        libc.pthread_mutex_lock(mutex)"),
])
def test_time_limit_when_the_script_cannot_be_stopped(tmp_path, mode, marker):
    """The watchdog writes the report with what was seen and ends the process."""
    started = time.monotonic()
    result, report = check_to_file(tmp_path, MISBEHAVE, "--timeout", "4", "--", mode)
    run = report["run"]
    assert run["status"] == "timeout" and run["steps"] == 3
    assert "did not stop" in run["error"]["message"]
    with open(MISBEHAVE, encoding="utf-8") as f:
        source = f.read()
    expected = source[:source.index(marker)].count("\n") + 1 + marker.count("\n")
    assert expected <= run["error"]["location"]["line"] <= expected + 2
    assert BUG in findings_at(report)
    assert result.returncode == 2  # incomplete
    assert time.monotonic() - started < 60


def test_time_limit_in_c_code_that_holds_the_interpreter_lock(tmp_path):
    """No Python thread can run: faulthandler ends the process (exit 1, stacks on stderr) and
    the --output file holds the provisional report written after the last step."""
    result, report = check_to_file(tmp_path, MISBEHAVE, "--timeout", "4", "--", "gil-hang")
    assert result.returncode == 1
    assert "Timeout" in result.stderr and "misbehave.py" in result.stderr
    run = report["run"]
    assert run["status"] == "crashed" and run["error"]["type"] == "Unfinished"
    # the report after step 3 is the last one written, unless a loaded machine made the earlier
    # writes slow enough that the bounded share of time for them skipped it (session.py,
    # CHECKPOINT_SHARE): then the one after step 2, which already holds the bug
    assert run["steps"] in (2, 3) and BUG in findings_at(report)


def test_changed_working_directory(tmp_path):
    """A relative --output lands where graddoctor was started, not where the script went."""
    script = tmp_path / "train.py"
    shutil.copy(MISBEHAVE, script)
    result = run_cli("check", "train.py", "-f", "json", "-o", "out.json", "--", "chdir", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert report["run"]["status"] == "completed"
    assert any("changed the working directory" in n for n in report["run"]["notes"])
    assert ("missing-zero-grad", BUG[1]) in findings_at(report)
    assert report["findings"][0]["location"]["path"] == "train.py"


def test_script_reads_standard_input(tmp_path):
    result, report = check_to_file(tmp_path, MISBEHAVE, "--", "stdin", input="line one\nline two\n")
    assert "read from stdin: 'line one\\nline two\\n'" in result.stderr + result.stdout
    assert report["run"]["status"] == "completed"


def test_a_lot_of_output_keeps_json_stdout_clean(tmp_path):
    """Prints, raw writes to file descriptor 1 and child processes all go to stderr."""
    result = run_cli("check", MISBEHAVE, "-f", "json", "--", "print-lots")
    report = json.loads(result.stdout)
    assert report["run"]["status"] == "step-limit"
    prints = result.stderr.count("x" * 2000)
    assert prints >= 10  # the step budget ends the loop at its next backward
    assert result.stderr.count("written to file descriptor 1") == prints
    assert result.stderr.count("a child process writes to stdout") == prints


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_and_multiprocessing(tmp_path, context):
    """DataLoader workers (two forked, or one spawned: a spawned worker re-imports the script as
    __mp_main__ and is not instrumented), and a spawn Pool whose child prints to stdout."""
    result = run_cli("check", os.path.join(SCRIPTS, "workers.py"), "-f", "json", "--", context,
                     timeout=180)
    report = json.loads(result.stdout)
    run = report["run"]
    assert run["status"] == "step-limit" and run["steps"] >= 10, run  # 2 epoch boundaries
    assert report["findings"] == [] and report["internal_errors"] == []
    assert result.returncode == 0, result.stderr[-3000:]
    if context == "spawn":
        assert "pool results [1, 4, 9]" in result.stderr
        assert "pool worker computes 2" in result.stderr


def test_module_mode_crash_with_relative_import(tmp_path):
    result, report = check_to_file(tmp_path, "-m", "gdpkg.train", "--", "--crash", cwd=SCRIPTS)
    run = report["run"]
    assert run["status"] == "crashed" and run["steps"] == 3
    assert run["error"]["message"] == "crash in __main__ from gdpkg.train"
    line = marked_line(os.path.join(SCRIPTS, "gdpkg", "train.py"))
    assert [(f["rule"], f["location"]["path"], f["location"]["line"]) for f in report["findings"]] \
        == [("missing-zero-grad", os.path.join("gdpkg", "train.py"), line)]
    assert result.returncode == 2  # crashed after steps: incomplete


@pytest.mark.parametrize("folder, name", [("with spaces", "my train.py"),
                                          ("nön-äscii ü", "träin_ß.py")])
def test_paths_with_spaces_and_non_ascii(tmp_path, folder, name):
    where = tmp_path / folder
    where.mkdir()
    shutil.copy(MISBEHAVE, where / name)
    relative = os.path.join(folder, name)
    result, report = check_to_file(where, relative, cwd=tmp_path)
    assert report["run"]["script"] == relative
    assert [(f["location"]["path"], f["location"]["line"]) for f in report["findings"]] \
        == [(relative, BUG[1])]
    assert result.returncode == 1
    # the terminal view too, also when the terminal cannot encode the name
    for encoding in ("utf-8", "ascii"):
        text = run_cli("check", relative, cwd=tmp_path, PYTHONIOENCODING=encoding)
        assert text.returncode == 1, text.stderr[-2000:]
        assert "Traceback" not in text.stderr
        shown = relative if encoding == "utf-8" else relative.encode("ascii", "backslashreplace").decode()
        assert f"{shown}:{BUG[1]}" in text.stdout


def test_a_step_that_raises_does_not_hide_later_steps():
    """Its post hook never runs; the steps after it must still count as steps (not as steps
    nested in one that never ended)."""
    from graddoctor.run.session import run_check
    from graddoctor.options import CheckOptions

    script = os.path.join(SCRIPTS, "step_raises.py")
    report = run_check(CheckOptions(target=script))
    assert (report.run.status, report.run.steps) == ("completed", 5)
    assert [(f.rule, f.location.line) for f in report.findings] \
        == [("missing-zero-grad", marked_line(script))]
