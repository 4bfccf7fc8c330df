"""What a new user meets in the first hour: a crash's traceback, --diff alone on stdout,
non-Python files refused at once, a script that needs arguments, typos answered with
suggestions, and the small conventions (--version in --help, -o's formats, rules as JSON,
--quiet). In-process through typer's runner (the real process is not the point here)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from report_samples import MISSING_ZERO_GRAD, write

runner = CliRunner()


def test_a_crash_shows_the_scripts_traceback_on_stderr_before_the_report(tmp_path):
    script = write(tmp_path, "e.py", textwrap.dedent("""\
        import torch

        def load():
            raise RuntimeError("boom")

        load()
    """))
    result = runner.invoke(app, ["check", script, "--steps", "2"])
    assert result.exit_code == 2
    err = result.stderr
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert f'File "{script}", line 6, in <module>' in err and f'File "{script}", line 4, in load' in err
    assert "RuntimeError: boom" in err
    assert "graddoctor" not in err.split("RuntimeError: boom")[0]  # the script's frames only
    assert "script error at" in result.stdout  # the report's line stays


def test_diff_is_alone_on_stdout_and_the_scripts_prints_go_to_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", "print('epoch 1 done')\n" + MISSING_ZERO_GRAD)
    result = runner.invoke(app, ["check", "train.py", "--steps", "3", "--diff", "--no-verify"])
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n"), result.stdout
    assert "epoch 1 done" not in result.stdout and "epoch 1 done" in result.stderr


@pytest.mark.parametrize("name, text", [
    ("notes.txt", "notes\n"),  # valid Python: python would run it into a NameError
    ("config.yaml", "steps: 3\n"),
    ("model.pt", "x = 1\n"),
])
def test_a_non_python_file_is_refused_at_once(tmp_path, name, text):
    path = write(tmp_path, name, text)
    result = runner.invoke(app, ["check", path])
    assert result.exit_code == 2
    assert f"{path} is not a Python script" in result.stderr
    assert "-m package.module" in result.stderr and ".ipynb" in result.stderr


def test_the_refusal_comes_before_torch_is_imported(tmp_path):
    import subprocess

    from conftest import ROOT, cli_env

    write(tmp_path, "notes.txt", "notes\n")
    code = ("import sys\nfrom graddoctor.cli import main\nsys.argv = ['graddoctor', 'check', 'notes.txt']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr


def test_a_script_that_needs_arguments_gets_the_command_line_with_them_after_dashes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", textwrap.dedent("""\
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--data", required=True)
        parser.add_argument("--lr", type=float, default=0.1)
        parser.add_argument("epochs", type=int)
        args = parser.parse_args()
    """))
    result = runner.invoke(app, ["check", "train.py", "--steps", "2"])
    assert result.exit_code == 2
    assert "the following arguments are required: --data, epochs" in result.stderr  # argparse's own
    out = " ".join(result.stdout.split())
    assert "its arguments go after `--`, e.g. graddoctor check train.py -- --data DATA epochs" in out, out


def test_an_exit_code_2_of_the_scripts_own_gets_no_arguments_note(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", "import sys, torch\nsys.exit(2)\n")
    result = runner.invoke(app, ["check", "train.py", "--steps", "2"])
    assert result.exit_code == 2 and "argparse" not in result.stdout


# -- --format github: workflow commands ------------------------------------------------------

def test_github_format_annotates_each_finding_at_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    result = runner.invoke(app, ["check", "train.py", "--steps", "3", "--format", "github"])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("::error file=train.py,line=12,title=graddoctor GD101 missing-zero-grad::"), lines
    assert "%0Afix: " in lines[0]  # one line per command: the newline escaped
    assert lines[-1].startswith("✗ 1 error")
    assert all(line.startswith("::") for line in lines[:-1])


def test_github_format_escapes_as_the_runner_reads_it(tmp_path):
    from graddoctor.report.github import command

    assert command("warning", "50% of it\nnext", path="a,b:c.py", line=3, title="t: x, y") == \
        "::warning file=a%2Cb%3Ac.py,line=3,title=t%3A x%2C y::50%25 of it%0Anext"
    assert command("notice", "no place") == "::notice::no place"


def test_github_format_reports_a_crash_as_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", "import torch\nraise RuntimeError('data folder missing')\n")
    result = runner.invoke(app, ["check", "train.py", "--format", "github"])
    assert result.exit_code == 2
    assert "::error file=train.py,line=2,title=graddoctor%3A crashed::graddoctor could not check" \
        in result.stdout


# -- "did you mean" ----------------------------------------------------------------------------

def test_explain_suggests_the_closest_rule_instead_of_listing_all():
    result = runner.invoke(app, ["explain", "missing-zero-grd"])
    assert result.exit_code == 2
    assert "did you mean 'missing-zero-grad'?" in result.stderr
    assert "stale-grad" not in result.stderr  # not the whole list


def test_select_suggests_the_closest_rule(tmp_path):
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    result = runner.invoke(app, ["check", str(tmp_path / "train.py"), "--select", "stale-grd"])
    assert result.exit_code == 2 and "did you mean 'stale-grad'?" in result.stderr, result.stderr


def test_a_config_key_typo_gets_a_suggestion(tmp_path):
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    write(tmp_path, "pyproject.toml", "[tool.graddoctor]\nstpes = 3\n")
    result = runner.invoke(app, ["check", str(tmp_path / "train.py")])
    assert result.exit_code == 2 and "unknown option 'stpes' (did you mean 'steps'?)" in result.stderr, \
        result.stderr


def test_did_you_mean_stays_quiet_when_nothing_is_close():
    from graddoctor.errors import did_you_mean

    assert did_you_mean("zzz", ["steps", "timeout"]) == ""
    assert did_you_mean("TIMEOT", ["steps", "timeout"]) == " (did you mean 'timeout'?)"


# -- small conventions --------------------------------------------------------------------------

def test_version_is_listed_in_help_and_prints_the_version():
    from graddoctor.version import __version__

    help_text = runner.invoke(app, ["--help"]).stdout
    assert "--version" in help_text
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"graddoctor {__version__}"


def test_output_help_names_every_format_its_file_name_selects():
    from graddoctor.options import OPTIONS
    from graddoctor.report.formats import SUFFIXES

    text = OPTIONS["output"].help
    for suffix, name in SUFFIXES.items():
        assert suffix in text and name in text, (suffix, text)


def test_rules_as_json_for_tools():
    from graddoctor.rules import ALL_RULES

    result = runner.invoke(app, ["rules", "--format", "json"])
    assert result.exit_code == 0
    rules = json.loads(result.stdout)
    assert [r["code"] for r in rules] == [r.code for r in ALL_RULES]
    assert all(set(r) == {"code", "slug", "severity", "summary", "fix", "autofix"} for r in rules)
    zero_grad = next(r for r in rules if r["code"] == "GD101")
    assert zero_grad["slug"] == "missing-zero-grad" and zero_grad["autofix"] == "safe"


def test_quiet_prints_only_the_findings_and_the_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    loud = runner.invoke(app, ["check", "train.py", "--steps", "3"]).stdout
    result = runner.invoke(app, ["check", "train.py", "--steps", "3", "--quiet"])
    assert result.exit_code == 1
    out = result.stdout
    assert "graddoctor  train.py" in loud and "update timeline" in loud
    assert "graddoctor  train.py" not in out and "update timeline" not in out and "device cpu" not in out
    assert "error GD101 missing-zero-grad  train.py:12" in out
    assert out.rstrip().splitlines()[-1] == "✗ 1 error, 0 warnings, 0 info"


def test_graddoctor_alone_prints_its_help_and_exits_2(monkeypatch, capsys):
    # main() runs typer outside its standalone mode, where click >= 8.2 raises the help as an
    # error for its caller to print: nothing at all came out before
    from graddoctor.cli import main

    monkeypatch.setattr(sys, "argv", ["graddoctor"])
    with pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code == 2
    out = capsys.readouterr()
    shown = out.out + out.err
    assert shown.count("Usage: graddoctor") == 1, shown
    assert "check" in shown and "explain" in shown
