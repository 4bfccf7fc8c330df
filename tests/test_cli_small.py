"""Small CLI behaviours: --version, unknown options, --select/--ignore leaving no rule."""

from __future__ import annotations

import pytest

from conftest import run_cli
from graddoctor.errors import ScriptError
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check
from graddoctor.version import __version__


def test_version():
    result = run_cli("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"graddoctor {__version__}")


def test_an_unknown_option_offers_close_options_not_help(tmp_path):
    result = run_cli("check", "x.py", "--stepz", "3", cwd=tmp_path)
    assert result.returncode == 2
    assert "did you mean --steps?" in result.stderr
    assert "Possible options" not in result.stderr
    top = run_cli("--frob", cwd=tmp_path)
    assert "--help)" not in top.stderr.splitlines()[0], top.stderr


def test_select_and_ignore_that_leave_no_rule_are_an_error(tmp_path):
    from graddoctor import check_script

    (tmp_path / "train.py").write_text("import torch\n")
    with pytest.raises(ScriptError, match="leave no rule"):
        check_script(tmp_path / "train.py", select=["GD101"], ignore=["missing-zero-grad"],
                     config=False)


def test_rule_summaries_are_plain_text():
    # `graddoctor rules`, SARIF's shortDescription and the JSON show them as they are; the
    # README's table adds the Markdown (rules/docs.py markdown_summary)
    from graddoctor.rules import ALL_RULES

    assert [r.code for r in ALL_RULES if "`" in r.summary] == []


def test_rules_in_a_pipe_use_the_reports_width():
    result = run_cli("rules")
    assert max(len(line) for line in result.stdout.splitlines()) > 80
    assert max(len(line) for line in result.stdout.splitlines()) <= 100


def test_an_ignore_comment_naming_no_rule_gets_a_note(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch\nm = torch.nn.Linear(2, 1)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    m(torch.randn(4, 2)).sum().backward()  # graddoctor: ignore[missing-zero-gard]\n"
        "    o.step()  # graddoctor: ignore[GD1, double-step]\n")
    report = run_check(CheckOptions(target=str(tmp_path / "train.py")))
    notes = [n for n in report.run.notes if "names no rule" in n]
    assert len(notes) == 1 and "train.py:5" in notes[0] and "missing-zero-gard" in notes[0], notes
    assert [f.suppressed for f in report.findings] == [False]
