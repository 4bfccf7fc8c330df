"""Every command the documentation shows (README.md and docs/*.md) still works as written.

The commands are the lines of the ```bash blocks and the ``$ ``-prompted lines of plain blocks.
A ``graddoctor`` command (also ``python -m graddoctor`` and a launcher's ``-m graddoctor``) must
parse against the real CLI; ``rules`` and ``explain`` run (they are light), and a check of a
script that lies in the repository runs as written and reaches a verdict (exit 0 or 1, never
2). ``python FILE`` / ``python -m MODULE`` must name a file or module of the repository whose
source knows the flags given; ``pip install`` must name extras that pyproject.toml defines.
Links between the pages must point at files that exist."""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest
import typer.main
from typer.testing import CliRunner

from conftest import ROOT
from graddoctor.cli import app

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def shown_commands(text: str) -> list[list[str]]:
    """The commands a page shows, each split as the shell would (``&&`` separates two)."""
    lines = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("bash", "sh", "shell"):
            lines += body.replace("\\\n", " ").splitlines()
        elif lang in ("", "console"):
            lines += [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1:]
    return commands


def graddoctor_args(command: list[str]) -> list[str] | None:
    """The arguments graddoctor gets from a shown command, or None when it does not run graddoctor."""
    if command[0] == "graddoctor":
        return command[1:]
    for i in range(len(command) - 1):
        if command[i:i + 2] == ["-m", "graddoctor"]:
            return command[i + 2:]
    return None


def _parse(args: list[str]):
    group = typer.main.get_command(app)
    command = group.commands[args[0]]
    return command.make_context(args[0], list(args[1:]))


ALL = [(page, command) for page in PAGES
       for command in shown_commands(open(os.path.join(ROOT, page), encoding="utf-8").read())]
GRADDOCTOR = [(page, c) for page, c in ALL if graddoctor_args(c) is not None]
PYTHON = [(page, c) for page, c in ALL if c[0] == "python" and graddoctor_args(c) is None]
PIP = [(page, c) for page, c in ALL if c[:2] == ["pip", "install"]]


def _id(item) -> str:
    page, command = item
    return f"{page}:{' '.join(command)[:60]}"


def test_the_pages_show_commands():
    assert len(GRADDOCTOR) >= 8 and PYTHON and PIP
    assert ("README.md", ["graddoctor", "check", "examples/buggy_train.py"]) in GRADDOCTOR


@pytest.mark.parametrize("item", GRADDOCTOR, ids=[_id(i) for i in GRADDOCTOR])
def test_graddoctor_command_parses(item):
    page, command = item
    args = graddoctor_args(command)
    ctx = _parse(args)
    assert ctx.command.name == args[0]


def test_the_set_up_check_runs_as_written(monkeypatch):
    monkeypatch.chdir(ROOT)
    runner = CliRunner()
    ran = 0
    for page, command in GRADDOCTOR:
        args = graddoctor_args(command)
        if args[0] in ("rules", "explain"):
            result = runner.invoke(app, args)
            assert result.exit_code == 0, f"{page}: {' '.join(command)}\n{result.output}"
            ran += 1
        elif args[0] == "check" and os.path.isfile(os.path.join(ROOT, args[1])) and not args[1].startswith("-"):
            if any(a in args for a in ("--fix", "--nproc-per-node")):
                continue  # writes the repository's file / starts ranks: parsed above
            result = runner.invoke(app, args)
            assert result.exit_code in (0, 1), f"{page}: {' '.join(command)}\n{result.output}"
            ran += 1
    assert ran


def _known_flags(source: str) -> set[str]:
    return set(re.findall(r"""["'](--[\w-]+)""", source))


@pytest.mark.parametrize("item", PYTHON, ids=[_id(i) for i in PYTHON])
def test_python_command_names_a_file_or_module_that_takes_its_flags(item):
    page, command = item
    if command[1] == "-m":
        module = command[2]
        if module == "pytest":
            return
        path = os.path.join(ROOT, *module.split("."))
        path = path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__main__.py")
        flags = command[3:]
    else:
        path, flags = os.path.join(ROOT, command[1]), command[2:]
    assert os.path.isfile(path), f"{page}: {' '.join(command)}: no {os.path.relpath(path, ROOT)}"
    with open(path, encoding="utf-8") as f:
        known = _known_flags(f.read())
    unknown = [flag.split("=")[0] for flag in flags if flag.startswith("--") and flag.split("=")[0] not in known]
    assert not unknown, f"{page}: {' '.join(command)}: {unknown} unknown to {os.path.relpath(path, ROOT)}"


@pytest.mark.parametrize("item", PIP, ids=[_id(i) for i in PIP])
def test_pip_install_names_defined_extras(item):
    page, command = item
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"].get("optional-dependencies", {}))
    for arg in command[2:]:
        for extra in re.findall(r"^\.?\[([\w,-]+)\]$", arg):
            assert set(extra.split(",")) <= extras, f"{page}: {arg}"


def test_links_between_pages_point_at_files():
    broken = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target)):
                broken.append(f"{page}: {target}")
    assert not broken


def test_the_readme_is_the_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) < 300
    for page in PAGES[1:]:
        if page != "docs/development.md":
            assert f"]({page})" in text, f"README.md does not link {page}"


# --- the checker can fail ------------------------------------------------------------------

def test_a_stale_command_would_be_caught():
    [command] = shown_commands("```bash\ngraddoctor check train.py --no-such-flag  # gone\n```\n")
    with pytest.raises(Exception) as info:  # typer may bundle its own click: by class name
        _parse(graddoctor_args(command))
    assert "UsageError" in {cls.__name__ for cls in type(info.value).__mro__}
    assert shown_commands("```\n$ graddoctor rules && python -m pytest -q\nout\n```\n") == [
        ["graddoctor", "rules"], ["python", "-m", "pytest", "-q"]]
