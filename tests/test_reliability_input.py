"""Bad input: exit 2 and one clear line naming the problem, never a traceback, never a run."""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli
from graddoctor.run.session import ScriptError
from graddoctor.options import resolve
from reliability_helpers import check_to_file

# every case gets a folder with these files; the script leaves ran.txt behind if it ever runs
TRAIN = "open('ran.txt', 'w').write('ran')\nimport torch\n"
FILES = {
    "train.py": TRAIN,
    "notes.txt": "hello world",
    "binary.py": "\0\1\2",
    "bad.py": "def f(:\n    pass\n",
}


def _usage_error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("graddoctor: error:")]


@pytest.mark.parametrize("args, needle", [
    (["check", "nope.py"], "no such file: nope.py"),
    (["check", "folder"], "folder is a directory"),
    (["check", "notes.txt"], "notes.txt is not a Python script"),
    (["check", "binary.py"], "binary.py is not a Python script"),
    (["check", "bad.py"], "bad.py:1: syntax error"),
    (["check", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    (["check"], "Missing argument"),
    (["check", "train.py", "--frobnicate"], "No such option: --frobnicate"),
    (["check", "train.py", "--steps", "-1"], "'--steps'"),
    (["check", "train.py", "--steps", "many"], "'--steps'"),
    (["check", "train.py", "--steps", "1.5"], "'--steps'"),
    (["check", "train.py", "--timeout", "soon"], "'--timeout'"),
    (["check", "train.py", "--timeout", "-3"], "'--timeout'"),
    (["check", "train.py", "--timeout", "nan"], "'--timeout'"),
    (["check", "train.py", "--device", "tpu"], "'--device'"),
    (["check", "train.py", "--format", "xml"], "'--format'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="latin-1")
    (tmp_path / "folder").mkdir()
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = _usage_error_lines(result.stderr)
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stdout == ""
    assert not (tmp_path / "ran.txt").exists(), "the script must not run"


def test_script_importing_a_missing_module_is_a_crash_before_any_step(tmp_path):
    """It is the user's script that fails (python would fail the same way): status crashed,
    exit 2 (nothing could be checked), and the ModuleNotFoundError in the report."""
    (tmp_path / "train.py").write_text("import torch\nimport not_installed_anywhere_xyz\n")
    result, report = check_to_file(tmp_path, "train.py", cwd=tmp_path)
    assert result.returncode == 2
    run = report["run"]
    assert run["status"] == "crashed" and run["steps"] == 0
    assert run["error"]["type"] == "ModuleNotFoundError"
    assert "not_installed_anywhere_xyz" in run["error"]["message"]
    assert run["error"]["location"] == {"path": "train.py", "line": 2}
    # the script's traceback, as python shows it: its own frame only
    assert 'File "' in result.stderr and "graddoctor" not in result.stderr.split("Traceback", 1)[1].split(
        "ModuleNotFoundError", 1)[0]

    text = run_cli("check", "train.py", cwd=tmp_path)
    assert text.returncode == 2
    shown = " ".join(text.stdout.split())  # the terminal view may wrap long lines
    assert "train.py:2: ModuleNotFoundError: No module named 'not_installed_anywhere_xyz'" in shown
    assert "could not check" in shown


def test_json_to_stdout_stays_json_for_a_failing_script(tmp_path):
    (tmp_path / "train.py").write_text("print('hello from the script')\nraise SystemExit(4)\n")
    result = run_cli("check", "train.py", "-f", "json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert report["run"]["status"] == "crashed" and report["run"]["error"]["type"] == "SystemExit"
    assert "hello from the script" in result.stderr
    assert result.returncode == 2


def validated(**values):
    """The options of a library check of x.py with these values, through the one resolver."""
    return resolve("x.py", values=values, explicit=values, source="library",
                   use_config=False).options


@pytest.mark.parametrize("steps, timeout, expect_timeout", [
    (0, None, None), (3, 0, None), (3, 0.0, None), (3, math.inf, None), (3, 2.5, 2.5), (3, "7", 7.0),
])
def test_library_options_normalised(steps, timeout, expect_timeout):
    options = validated(steps=steps, timeout=timeout)
    assert options.timeout == expect_timeout and options.steps == steps


@pytest.mark.parametrize("kwargs", [
    {"steps": -1}, {"steps": 1.5}, {"steps": True}, {"steps": "3"},
    {"timeout": -1}, {"timeout": math.nan}, {"timeout": "soon"}, {"device": "tpu"},
])
def test_library_rejects_bad_options(kwargs):
    with pytest.raises(ScriptError) as info:
        validated(**kwargs)
    assert next(iter(kwargs)) in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": -1}, "--steps must be a whole number >= 0 (0 = run to the end), not -1"),
    ({"epoch_batches": 1.5}, "--epoch-batches must be a whole number >= 0 (0 = the real length), "
                             "not 1.5"),
    ({"timeout": "soon"}, "--timeout must be a number of seconds >= 0 (0 = no limit), not 'soon'"),
    ({"timeout": None, "device": "tpu"}, "--device must be one of auto, cpu, cuda, not 'tpu'"),
], ids=["steps", "epoch-batches", "timeout", "device"])
def test_library_messages_are_unchanged(kwargs, message):
    """The library's wording for a bad value (pinned: the option table words it now)."""
    with pytest.raises(ScriptError) as info:
        validated(**kwargs)
    assert str(info.value) == message


def test_library_checks_every_option_of_the_table():
    """fail_on and the selectors are checked by the same table as the command line and the
    config, before the run (not after the whole run, in Report.exit_code)."""
    with pytest.raises(ScriptError, match="--fail-on must be one of error, warning, info, never, "
                                          "not 'warn'"):
        validated(fail_on="warn")
    with pytest.raises(ScriptError, match="--select must be a string or a list of strings"):
        validated(select=[3])
    options = validated(select=["GD1, stale-grad"], ignore="GD106")
    assert options.select == ("GD1", "stale-grad") and options.ignore == ("GD106",)
