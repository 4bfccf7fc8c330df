"""The CI recipe (docs/ci.md) stays valid: it installs graddoctor from where it is (not from the
package index, where it is not published), and every `graddoctor` command in it parses with
the real CLI; the SARIF it uploads is the file the check writes. And the set-up installs numpy
(without it torch warns "Failed to initialize NumPy" at every run)."""

from __future__ import annotations

import os
import re
import shlex

import pytest
import typer.main
import yaml
from packaging.requirements import Requirement

from conftest import ROOT
from graddoctor.cli import app

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _readme() -> str:
    with open(os.path.join(ROOT, "docs", "ci.md"), encoding="utf-8") as f:
        return f.read()


def _recipe() -> dict:
    section = _readme().split("# CI: GitHub Actions", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)


def _steps() -> list[dict]:
    jobs = _recipe()["jobs"]
    return [step for job in jobs.values() for step in job["steps"]]


def _commands(step: dict) -> list[list[str]]:
    env = step.get("env", {})
    text = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m.group(1) or m.group(2), m.group(0)),
                  step.get("run", ""))
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


def _all_commands() -> list[list[str]]:
    return [c for step in _steps() for c in _commands(step) if c]


def test_the_recipe_installs_graddoctor_from_its_repository_not_the_index():
    installs = [c for c in _all_commands() if c[:4] == ["python", "-m", "pip", "install"]]
    named = []
    for command in installs:
        for arg in command[4:]:
            if arg.startswith("-") or arg == "." or arg.startswith(("https://", "./")):
                continue
            requirement = Requirement(arg)
            if requirement.name == "graddoctor":
                named.append(requirement)
            else:
                assert requirement.name == "torch", arg
    assert len(named) == 1, installs
    assert named[0].url and named[0].url.startswith("git+https://"), named[0]


def _parse(args: list[str]) -> click.Context:
    group = typer.main.get_command(app)  # its only option is --help: the command comes first
    command = group.commands[args[0]]
    return command.make_context(args[0], list(args[1:]))


def test_every_graddoctor_command_of_the_recipe_parses():
    checks = [c for c in _all_commands() if c[0] == "graddoctor"]
    assert checks
    for command in checks:
        ctx = _parse(command[1:])
        assert ctx.command.name == "check"
    upload = next(s for s in _steps() if "upload-sarif" in s.get("uses", ""))
    sarif = upload["with"]["sarif_file"]
    ctx = _parse(checks[0][1:])
    assert ctx.params["output"] == sarif and ctx.params["format"] == "sarif"


def test_the_recipe_checks_the_gpu_path_and_says_what_cannot_be_emulated():
    checks = [_parse(c[1:]) for c in _all_commands() if c[0] == "graddoctor"]
    assert checks and all(ctx.params["emulate_cuda"] for ctx in checks)
    assert all(ctx.params["device"] == "auto" for ctx in checks)  # --device cpu would contradict it
    intro = _readme().split("# CI: GitHub Actions", 1)[1].split("```yaml", 1)[0]
    assert "--emulate-cuda" in intro and "cannot be emulated" in intro
    assert "emulate-cuda.md" in intro


def test_the_job_summary_is_the_markdown_report():
    checks = [c for c in _all_commands() if c[0] == "graddoctor"]
    summary = [_parse(c[1:]) for c in checks if "$GITHUB_STEP_SUMMARY" in c]
    assert len(summary) == 1
    ctx = summary[0]
    assert ctx.params["format"] == "markdown" and ctx.params["fail_on"] == "never"


def test_a_bad_option_would_be_caught():
    for args in (["check", "train.py", "--device", "tpu"], ["check", "train.py", "--no-such"]):
        with pytest.raises(Exception) as info:  # typer may bundle its own click: by class name
            _parse(args)
        assert "UsageError" in {cls.__name__ for cls in type(info.value).__mro__}


def test_numpy_is_a_dependency():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "numpy" in {Requirement(d).name for d in project["dependencies"]}
