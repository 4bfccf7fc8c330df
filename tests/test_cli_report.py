"""CLI: exit codes, formats, and the commands that must stay light (no torch import)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from conftest import ROOT, cli_env, run_cli
from graddoctor.cli import app
from graddoctor.rules import ALL_RULES
from report_samples import CLEAN, CRASH, MISSING_ZERO_GRAD, MISSING_ZERO_GRAD_LINE, UNUSED_LAYER, write

runner = CliRunner()


@pytest.mark.parametrize("source, args, code", [
    (MISSING_ZERO_GRAD, [], 1),
    (MISSING_ZERO_GRAD, ["--fail-on", "never"], 0),
    (UNUSED_LAYER, ["--fail-on", "error"], 0),
    (UNUSED_LAYER, ["--fail-on", "warning"], 1),
    (CLEAN, ["--fail-on", "info"], 0),
    (CRASH, ["--fail-on", "never"], 2),
], ids=["error", "never", "warning<error", "warning>=warning", "clean", "crash"])
def test_exit_codes(tmp_path, source, args, code):
    script = write(tmp_path, "train.py", source)
    result = runner.invoke(app, ["check", script, "--steps", "3", *args])
    assert result.exit_code == code, result.output


def test_missing_script_exits_2():
    result = runner.invoke(app, ["check", "no_such_script.py"])
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_text_report_of_a_real_run_points_at_the_line_with_the_fix(tmp_path, monkeypatch):
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["check", "train.py", "--steps", "3", "--grad-flow"])
    out = result.stdout
    assert result.exit_code == 1
    assert "\x1b[" not in out  # not a terminal: plain
    assert f"error GD101 missing-zero-grad  train.py:{MISSING_ZERO_GRAD_LINE}" in out
    assert "fix: call optimizer.zero_grad()" in out
    assert f"backward L{MISSING_ZERO_GRAD_LINE} (GD101) → step L{MISSING_ZERO_GRAD_LINE + 1}" in out
    assert "SGD, step 3" in out and "█" in out  # grad flow
    assert out.rstrip().splitlines()[-1] == "✗ 1 error, 0 warnings, 0 info"


def test_rules_table_and_explain():
    result = runner.invoke(app, ["rules"])
    assert result.exit_code == 0
    for rule in ALL_RULES:
        assert rule.code in result.stdout and rule.slug in result.stdout
    for name in ("GD101", "missing-zero-grad", "gd101"):
        result = runner.invoke(app, ["explain", name])
        assert result.exit_code == 0
        assert "What it does" in result.stdout and "Use instead" in result.stdout
    result = runner.invoke(app, ["explain", "no-such-rule"])
    assert result.exit_code == 2 and "unknown rule 'no-such-rule'" in result.stderr


LIGHT = textwrap.dedent('''\
    import sys
    from typer.testing import CliRunner
    from graddoctor.cli import app
    runner = CliRunner()
    for args in (["--help"], ["check", "--help"], ["rules"], ["explain", "GD101"],
                 ["explain", "stale-grad"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
''')


def test_help_rules_and_explain_do_not_import_torch():
    out = subprocess.run([sys.executable, "-c", LIGHT], cwd=ROOT, env=cli_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_json_report_keeps_stdout_pure_even_when_the_script_prints(tmp_path):
    script = write(tmp_path, "train.py", CLEAN)
    result = runner.invoke(app, ["check", script, "--format", "json", "--steps", "0"])
    assert result.exit_code == 0
    json.loads(result.stdout)
    assert "done" in result.stderr


# -- the report formats: one interface, one registry ------------------------------------------

def test_every_format_renders_through_the_registry(tmp_path):
    from graddoctor.report.formats import FORMATS, RenderOptions, get_format
    from graddoctor.report.json_format import render as render_json
    from graddoctor.report.sarif import render as render_sarif
    from graddoctor.report.text import render as render_text
    from report_samples import nonfinite_report, strict_json

    assert list(FORMATS) == ["text", "json", "sarif", "github", "html", "markdown"]
    report = nonfinite_report(str(tmp_path))
    for name, fmt in FORMATS.items():
        assert fmt.name == name and get_format(name) is fmt
        text = fmt.render(report, RenderOptions())
        if fmt.machine:  # documents for programs: strict JSON whatever the evidence holds
            strict_json(text)
    assert FORMATS["json"].render(report) == render_json(report)
    assert FORMATS["sarif"].render(report) == render_sarif(report)
    assert FORMATS["text"].render(report) == render_text(report, width=None, color=False)
    assert FORMATS["html"].render(report).startswith("<!DOCTYPE html>")
    assert FORMATS["markdown"].render(report).startswith("### graddoctor")
    with_flow = FORMATS["text"].render(report, RenderOptions(grad_flow=True))
    assert "gradient flow" in with_flow and "gradient flow" not in FORMATS["text"].render(report)
    with pytest.raises(ValueError, match="unknown report format 'xml'"):
        get_format("xml")


def test_the_command_line_offers_exactly_the_registered_formats():
    from graddoctor.report.formats import FORMATS

    result = run_cli("check", "x.py", "--format", "xml")
    assert result.returncode == 2
    assert "is not one of " + ", ".join(map(repr, FORMATS)) in result.stderr
    assert FORMATS["json"].machine and FORMATS["sarif"].machine and not FORMATS["text"].machine
