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
