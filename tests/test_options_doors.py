"""Options are resolved and validated in one place, options.py, whatever door a check comes in
by: the CLI's ``check`` and ``merge``, ``[tool.graddoctor]``, ``check_script()``,
``merge_reports()``, ``watch()``, the ``%%graddoctor`` magic, the pytest plugin's fixture and
marker. Each door is called with the resolver replaced by a spy that records the call and stops
the door there (nothing runs); a door that resolved or validated on its own would not reach
the spy. An ``ast`` scan holds the rest: no module but options.py checks a value against the
option table or reads the config, and the CLI does not borrow the API's resolution."""

from __future__ import annotations

import ast
import os
import types

import pytest

import graddoctor.options as options
from conftest import ROOT
from graddoctor import api, magic, pytest_plugin
from graddoctor.cli import app

PACKAGE = os.path.join(ROOT, "graddoctor")
RESOLVERS = ("resolve", "resolve_watch", "check_values")


class Stopped(Exception):
    """Raised by the spy: the door reached the resolver."""


@pytest.fixture
def spy(monkeypatch):
    calls: list[str] = []
    for name in RESOLVERS:
        def stop(*args, _name=name, **kwargs):
            calls.append(_name)
            raise Stopped(_name)

        monkeypatch.setattr(options, name, stop)
    return calls


def _cli(*args: str) -> None:
    app(args=list(args), prog_name="graddoctor", standalone_mode=False)


class _Item:
    """What the pytest plugin reads of a test item."""

    nodeid = "test_x.py::test_train"
    fixturenames = ()
    config = types.SimpleNamespace(getoption=lambda name, default=None: default)

    def get_closest_marker(self, name):
        return types.SimpleNamespace(args=(), kwargs={"select": "GD1"})


def _pytest_marker():
    hook = pytest_plugin.pytest_runtest_call(_Item())
    next(hook)


DOORS = {
    "cli check": (lambda: _cli("check", "train.py", "--steps", "3"), "resolve"),
    "cli merge": (lambda: _cli("merge", "--fail-on", "error", "r.0.json"), "check_values"),
    "check_script": (lambda: api.check_script("train.py", steps=3), "resolve"),
    "merge_reports": (lambda: api.merge_reports(["r.0.json"], fail_on="error"), "check_values"),
    "watch": (lambda: api.watch(steps=3), "resolve_watch"),
    "magic": (lambda: magic.graddoctor_cell_magic("--steps 3", "pass", shell=object()),
              "resolve_watch"),
    "pytest fixture": (lambda: pytest_plugin.GradDoctor(_Item(), {}).__enter__(), "resolve_watch"),
    "pytest marker": (_pytest_marker, "resolve_watch"),
}


@pytest.mark.parametrize("door", list(DOORS))
def test_each_door_goes_through_the_one_resolver(door, spy, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")  # (the CLI refuses a missing file before resolving)
    call, resolver = DOORS[door]
    with pytest.raises(Stopped):
        call()
    assert spy == [resolver], f"{door} resolved its options {spy or 'without the resolver'}"


def test_the_config_door_is_read_through_the_resolver(tmp_path, monkeypatch):
    """[tool.graddoctor] reaches a check only through ``resolve``: its values validated there
    (a bad one is named with the file), a typed value beating it."""
    (tmp_path / "pyproject.toml").write_text("[tool.graddoctor]\nsteps = 4\nfail-on = 'error'\n")
    (tmp_path / "train.py").write_text("")
    resolved = options.resolve(str(tmp_path / "train.py"), values={"fail_on": "info"},
                               explicit={"fail_on"}, source="library")
    assert (resolved.options.steps, resolved.options.fail_on) == (4, "info")
    (tmp_path / "pyproject.toml").write_text("[tool.graddoctor]\nsteps = -1\n")
    with pytest.raises(api.ScriptError, match=r"pyproject.toml: \[tool.graddoctor\] steps must be"):
        options.resolve(str(tmp_path / "train.py"), source="library")


def _modules():
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, PACKAGE), ast.parse(f.read())


SOURCES = {"config", "library", "python"}  # who gave a value, as the option table's checks take it
CONFIG_READERS = {"find_config", "read_table", "load_config", "validate_config"}


def test_only_the_resolver_validates_options_or_reads_the_config():
    found = []
    for rel, tree in _modules():
        if rel == "options.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("check", "error") and any(
                        isinstance(a, ast.Constant) and a.value in SOURCES for a in node.args):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and rel != "config.py":
                names = {a.name for a in node.names}
                if names & CONFIG_READERS:
                    found.append(f"{rel}:{node.lineno}: imports {sorted(names & CONFIG_READERS)}")
    assert not found, "options validated or the config read outside options.py:\n" + "\n".join(found)


def test_the_cli_does_not_borrow_the_apis_resolution():
    _, tree = next((rel, tree) for rel, tree in _modules() if rel == "cli.py")
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "api" not in imported
