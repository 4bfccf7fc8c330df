"""The terminal report, rendered into a StringIO console and read back."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest
from rich.console import Console

from graddoctor.report.text import render, render_to, wants_color
from report_samples import sample_report


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """The sample script is ``train.py`` in the working folder, as after `graddoctor check
    train.py`: where the report wraps must not depend on how long pytest's temporary folder's
    path is (longer under pytest-xdist workers, or for a long user name)."""
    monkeypatch.chdir(tmp_path)


def draw(report, width=110, **kw) -> str:
    buf = io.StringIO()
    render_to(Console(file=buf, width=width), report, **kw)
    return buf.getvalue()


def test_header_names_script_device_torch_steps_and_status(tmp_path):
    out = draw(sample_report(""))
    head = "\n".join(out.splitlines()[:4])
    assert "train.py" in head
    assert "device cpu" in head and "torch 2.13.0+cpu" in head
    assert "4/10 optimizer steps replayed" in head
    assert "status step-limit" in head and "stopped after the step budget" in head


def test_findings_are_grouped_by_severity_with_suppressed_last(tmp_path):
    out = draw(sample_report(""))
    titles = [out.index(t) for t in ("1 error", "1 warning", "1 info", "1 suppressed")]
    assert titles == sorted(titles), out
    assert out.index("GD101 missing-zero-grad") < titles[1] < out.index("GD106 param-without-grad")
    assert "GD102 partial-zero-grad" in out[titles[3]:]
    assert "suppressed by # graddoctor: ignore" in out


def test_each_finding_shows_source_line_marked_related_and_fix(tmp_path):
    out = draw(sample_report(""))
    block = out[out.index("GD101 missing-zero-grad"):out.index("1 warning")]
    assert "train.py:4" in block
    assert "gradients from step 1 are applied again" in block
    marked = [line for line in block.splitlines() if "❱" in line]
    assert len(marked) == 1 and "4" in marked[0] and "loss_fn(model(x), y).backward()" in marked[0]
    assert "optimizer.zero_grad()" in block  # context line above
    assert re.search(r"↳ .*train\.py:5\s+the step that applies them", block)
    assert "fix: call optimizer.zero_grad() once per update" in block
    assert "graddoctor explain missing-zero-grad" in block


def test_finding_without_location_renders(tmp_path):
    out = draw(sample_report(""))
    assert "(no location in the code)" in out


def test_timeline_shows_each_update_shape_once_with_offender_highlighted(tmp_path):
    out = draw(sample_report(""))
    section = out[out.index("update timeline"):]
    lines = [line for line in section.splitlines() if "→" in line]
    # the first update of each epoch starts at the epoch; the second ends with the scheduler
    assert any(line.rstrip().endswith("1, 3   epoch L2 → zero_grad L3 → backward L4 (GD101) → step L5")
               for line in lines), lines
    assert any(line.rstrip().endswith("2, 4   zero_grad L3 → backward L4 (GD101) → step L5 → sched.step L6")
               for line in lines), lines
    assert all("bn_forward" not in line for line in lines)
    assert "2×" in section  # two updates share each shape
    # a suppressed finding does not flag its line
    assert "(GD102)" not in section


def test_verdict_is_the_last_line(tmp_path):
    out = draw(sample_report(""))
    assert out.rstrip().splitlines()[-1] == "✗ 1 error, 1 warning, 1 info, 1 suppressed"


def test_verdict_clean_and_could_not_check(tmp_path):
    report = sample_report("", suppressed=False)
    report = replace(report, findings=[f for f in report.findings if f.severity.value == "info"])
    assert draw(report).rstrip().splitlines()[-1] == "✓ no gradient bugs found in 4 optimizer steps (1 info)"
    report = replace(report, run=replace(report.run, status="no-training-loop", steps=0,
                                         backward_calls=0))
    assert draw(report).rstrip().splitlines()[-1].startswith("✗ could not check: no backward()")


def test_crashed_run_shows_the_script_error(tmp_path):
    report = sample_report("", status="crashed")
    out = draw(report)
    assert "script error at" in out and "RuntimeError: boom" in out
    assert out.splitlines()[-1] == "✗ incomplete (crashed after 4 optimizer steps): 1 error, 1 " \
                                   "warning, 1 info so far, 1 suppressed"
    assert report.exit_code() == 2
    report = replace(report, allow_incomplete=True)  # the old verdict: by the findings
    assert "the replay ended early: crashed after 4 steps" in draw(report).splitlines()[-1]
    assert report.exit_code() == 1


@pytest.mark.parametrize("status, allow, code, mark", [
    ("crashed", False, 2, "✗ incomplete (crashed after 4 optimizer steps): 0 errors"),
    ("timeout", False, 2, "✗ incomplete (timeout after 4 optimizer steps): 0 errors"),
    ("crashed", True, 0, "✓ no gradient bugs found in 4 optimizer steps"),
    ("step-limit", False, 0, "✓ no gradient bugs found in 4 optimizer steps"),
    ("backward-limit", False, 0, "✓ no gradient bugs found"),
    ("completed", False, 0, "✓ no gradient bugs found"),
])
def test_an_incomplete_check_fails_unless_allowed(status, allow, code, mark):
    """A script that crashed after some steps with nothing found exited 0 (CI green on a
    broken script): crashed and timeout are incomplete, exit 2, findings kept."""
    report = sample_report("", suppressed=False, status=status)
    report = replace(report, findings=[], allow_incomplete=allow)
    assert report.exit_code() == code
    assert draw(report).rstrip().splitlines()[-1].startswith(mark)


@pytest.mark.parametrize("fail_on, code, last", [
    ("warning", 1, "✗ 0 errors, 1 warning, 0 info"),
    ("error", 0, "! 0 errors, 1 warning, 0 info (below --fail-on error)"),
    ("never", 0, "! 0 errors, 1 warning, 0 info (--fail-on never)"),
])
def test_the_verdict_mark_agrees_with_the_exit_code(fail_on, code, last):
    """--fail-on error with a warning printed "✗ 0 errors, 1 warning" and exited 0."""
    report = sample_report("", suppressed=False)
    report = replace(report, findings=[f for f in report.findings if f.severity.value == "warning"],
                     fail_on=fail_on)
    assert report.exit_code() == code
    assert draw(report).rstrip().splitlines()[-1] == last


def test_a_clean_verdict_says_when_only_some_rules_ran():
    from graddoctor.rules import ALL_RULES

    report = sample_report("", suppressed=False)
    skipped = [r.code for r in ALL_RULES if not r.code.startswith("GD2")]
    report = replace(report, findings=[], run=replace(report.run, rules_skipped=skipped))
    ran = len(ALL_RULES) - len(skipped)
    assert draw(report).rstrip().splitlines()[-1] == (
        f"✓ no gradient bugs found in 4 optimizer steps · only {ran} of {len(ALL_RULES)} rules ran "
        "(--select/--ignore)")
    report = replace(report, run=replace(report.run, rules_skipped=[]))
    assert draw(report).rstrip().splitlines()[-1] == "✓ no gradient bugs found in 4 optimizer steps"


def test_grad_flow_bars_per_layer(tmp_path):
    report = sample_report("")
    assert "gradient flow" not in draw(report)
    out = draw(report, grad_flow=True)
    section = out[out.index("gradient flow"):]
    assert "AdamW, step 4" in section
    fc1 = next(line for line in section.splitlines() if line.startswith("model.fc1"))
    assert "█" in fc1 and "5.59e-01" in fc1  # sqrt(0.5² + 0.25²): weight and bias make one layer
    head = next(line for line in section.splitlines() if line.startswith("model.head"))
    assert "no .grad" in head and "█" not in head
    assert "log scale" in section


def test_plain_text_without_color_and_ansi_with_color(tmp_path):
    report = sample_report("")
    plain = render(report, width=100, color=False)
    assert "\x1b[" not in plain and "GD101" in plain
    colored = render(report, width=100, color=True)
    assert "\x1b[" in colored


def test_wants_color_only_on_a_terminal_without_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    assert wants_color(Tty())
    assert not wants_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color(Tty())
    monkeypatch.setenv("NO_COLOR", "")  # set but empty does not count (no-color.org)
    assert wants_color(Tty())
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_color(Tty())


def test_backward_calls_without_any_step_never_read_as_clean(tmp_path):
    report = sample_report("", suppressed=False)
    report = replace(report, findings=[f for f in report.findings if f.severity.value == "info"],
                     run=replace(report.run, steps=0, backward_calls=40))
    last = draw(report).rstrip().splitlines()[-1]
    assert not last.startswith("✓") and "no gradient bugs found" not in last
    assert last.startswith("! no optimizer step in 40 backward calls"), last


def test_a_missing_rank_is_not_called_a_script_error():
    from graddoctor.report.merge import Part, merge, missing_entry
    from graddoctor.report.model import Report, RunInfo

    rank0 = Report(run=RunInfo(script="train.py", argv=[], status="step-limit", steps=10,
                               backward_calls=10, world_size=2), findings=[])
    merged = merge([Part(rank0, 0, "rank 0", 1)],
                   missing=[missing_entry(1, "rank 1", "no report from rank 1")], world_size=2)
    text = merged.render("text")
    assert "the script raised an error" not in text
    assert "report never arrived" in text
