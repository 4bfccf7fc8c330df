"""What users hit on the command line: the report format from the -o
name, the verdict's mark and the exit code, incomplete checks, only some rules, a script option
typed before `--`, escape codes in a script's message."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from graddoctor.report.formats import format_for_output
from graddoctor.rules import ALL_RULES
from report_samples import CLEAN, UNUSED_LAYER, write

runner = CliRunner()

CRASH_AFTER_STEPS = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(20):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        if step == 2:
            raise RuntimeError("\\x1b[1mcheckpoint\\x1b[0m folder is \\x1b[31mmissing\\x1b[0m")
''')


def check(*args):
    return runner.invoke(app, ["check", *args], env={"COLUMNS": "200"})  # verdicts on one line


# -- -o report.json writes JSON ---------------------------------------------------------------

@pytest.mark.parametrize("name, fmt", [
    ("report.json", "json"), ("r.JSON", "json"), ("graddoctor.sarif", "sarif"),
    ("graddoctor.sarif.json", "sarif"), ("report.txt", None), ("report", None), ("json", None),
])
def test_format_for_output(name, fmt):
    assert format_for_output(name) == fmt


@pytest.mark.parametrize("name, typed, starts", [
    ("report.json", [], '{\n  "schema_version"'),
    ("out.sarif", [], '{\n  "$schema"'),
    ("report.txt", [], "graddoctor  "),
    ("report.json", ["--format", "text"], "graddoctor  "),  # a typed --format wins
    ("report.txt", ["-f", "json"], '{\n  "schema_version"'),
])
def test_the_output_name_sets_the_format_unless_typed(tmp_path, name, typed, starts):
    script = write(tmp_path, "train.py", CLEAN)
    out = tmp_path / name
    result = check(script, "--steps", "2", "-o", str(out), *typed)
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith(starts)


# -- the verdict's mark and the exit code -------------------------------------------------------

def test_fail_on_error_with_a_warning_passes_and_says_so(tmp_path):
    script = write(tmp_path, "train.py", UNUSED_LAYER)
    result = check(script, "--steps", "3", "--fail-on", "error")
    assert result.exit_code == 0
    last = result.stdout.rstrip().splitlines()[-1]
    assert last == "! 0 errors, 1 warning, 0 info (below --fail-on error)"
    out = tmp_path / "r.json"
    result = check(script, "--steps", "3", "--fail-on", "error", "-o", str(out))
    assert result.exit_code == 0
    assert "wrote" in result.stderr and "✗" not in result.stderr


# -- incomplete checks --------------------------------------------------------------------------

def test_a_script_that_crashes_after_some_steps_fails_the_check(tmp_path):
    script = write(tmp_path, "train.py", CRASH_AFTER_STEPS)
    result = check(script, "--steps", "10", "--format", "json")
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["run"]["status"] == "crashed" and report["run"]["steps"] == 3
    result = check(script, "--steps", "10")
    assert result.exit_code == 2
    assert result.stdout.rstrip().splitlines()[-1].startswith(
        "✗ incomplete (crashed after 3 optimizer steps): 0 errors, 0 warnings, 0 info so far")
    result = check(script, "--steps", "10", "--allow-incomplete")
    assert result.exit_code == 0, result.output  # the old behaviour, on request


def test_allow_incomplete_from_the_config_and_switched_off_on_the_command_line(tmp_path):
    script = write(tmp_path, "train.py", CRASH_AFTER_STEPS)
    (tmp_path / "pyproject.toml").write_text("[tool.graddoctor]\nallow-incomplete = true\n")
    assert check(script, "--steps", "10").exit_code == 0
    assert check(script, "--steps", "10", "--no-allow-incomplete").exit_code == 2


# -- escape codes from the script's own messages ------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json", "sarif"])
def test_terminal_escapes_in_a_script_message_are_stripped(tmp_path, fmt):
    script = write(tmp_path, "train.py", CRASH_AFTER_STEPS)
    result = check(script, "--steps", "10", "--format", fmt)
    assert "\x1b" not in result.stdout and "\\u001b" not in result.stdout  # raw or JSON-escaped
    assert "checkpoint folder is missing" in result.stdout
    if fmt == "json":
        error = json.loads(result.stdout)["run"]["error"]
        assert error["message"] == "checkpoint folder is missing"
        assert error["traceback"].endswith("RuntimeError: checkpoint folder is missing\n")


# -- only some rules ran ------------------------------------------------------------------------

def test_select_says_how_many_rules_ran_in_the_verdict_and_in_json(tmp_path):
    script = write(tmp_path, "train.py", CLEAN)
    ran = [r.code for r in ALL_RULES if r.code.startswith("GD2")]
    result = check(script, "--steps", "2", "--select", "GD2")
    assert result.exit_code == 0
    assert result.stdout.rstrip().splitlines()[-1] == (
        f"✓ no gradient bugs found in 2 optimizer steps · only {len(ran)} of {len(ALL_RULES)} "
        "rules ran (--select/--ignore)")
    report = json.loads(check(script, "--steps", "2", "--select", "GD2", "-f", "json").stdout)
    assert report["run"]["rules"] == {
        "ran": len(ran), "total": len(ALL_RULES),
        "skipped": [r.code for r in ALL_RULES if r.code not in ran]}
    report = json.loads(check(script, "--steps", "2", "-f", "json").stdout)
    assert report["run"]["rules"] == {"ran": len(ALL_RULES), "total": len(ALL_RULES), "skipped": []}


# -- a script's option typed before `--` --------------------------------------------------------

@pytest.mark.parametrize("tokens, split", [
    (["train.py", "--lr", "0.5"], (["train.py"], ["--lr", "0.5"])),
    (["train.py", "--lr", "0.5", "--steps", "3", "--fast"], (["train.py", "--steps", "3"], ["--lr", "0.5", "--fast"])),
    (["--steps=3", "-f", "json", "train.py", "--lr=0.5", "x", "--", "--more"],
     (["--steps=3", "-f", "json", "train.py"], ["--lr=0.5", "x", "--more"])),
    (["-m", "pkg.train", "--grad-flow", "--epochs", "1"], (["-m", "pkg.train", "--grad-flow"], ["--epochs", "1"])),
    (["--lr", "0.5", "train.py"], None),  # before the script: a typo, not the script's
])
def test_split_script_arguments(tokens, split):
    from graddoctor.options import split_script_arguments

    assert split_script_arguments(tokens) == split


def test_an_unknown_option_after_the_script_shows_the_command_with_dashes(tmp_path, monkeypatch, capsys):
    from graddoctor import cli

    script = write(tmp_path, "train.py", CLEAN)
    monkeypatch.setattr("sys.argv", ["graddoctor", "check", script, "--lr", "0.5", "--steps", "2"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "No such option: --lr" in err
    assert f"graddoctor check {script} --steps 2 -- --lr 0.5" in err
    assert "Traceback" not in err


def test_grad_flow_from_the_config_and_off_on_the_command_line(tmp_path):
    script = write(tmp_path, "train.py", CLEAN)
    (tmp_path / "pyproject.toml").write_text("[tool.graddoctor]\ngrad-flow = true\nsteps = 2\n")
    assert "gradient flow, last update" in check(script).stdout
    assert "gradient flow" not in check(script, "--no-grad-flow").stdout
