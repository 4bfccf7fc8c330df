"""Every `--help` shows its help texts as written: no word, and no bracketed text such as
`[tool.graddoctor]`, lost to markup (rich ate `[tool.graddoctor]` once)."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from graddoctor.cli import app

GROUP = typer.main.get_command(app)
COMMANDS = [[]] + [[name] for name in GROUP.commands]


def _flat(text: str) -> str:
    """Whitespace as one space, and none after a hyphen (the wrapper may break a line there)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def _sources(path: list[str]) -> list[str]:
    command = GROUP.commands[path[0]] if path else GROUP
    texts = [command.help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return [t for t in texts if t.strip()]


@pytest.mark.parametrize("columns", ["60", "120"])
@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "graddoctor")
def test_help_shows_every_help_text_whole(path, columns):
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="graddoctor",
                                env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    assert "\\[" not in shown  # an escape printed as such
    for text in _sources(path):
        for bracketed in re.findall(r"\[[^\]]*\]", text):
            assert _flat(bracketed) in shown, f"{bracketed!r} lost from {' '.join(path)} --help"
        assert _flat(text) in shown, f"help text not shown as written: {text!r}"


def test_the_check_help_names_the_config_table():
    result = CliRunner().invoke(app, ["check", "--help"], prog_name="graddoctor")
    assert "Settings come from [tool.graddoctor] in the closest pyproject.toml" in _flat(result.stdout)
