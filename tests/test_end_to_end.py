"""The real entry point, ``python -m graddoctor``, in a fresh interpreter — start-up and the
first import of torch and torch._dynamo included, as a user runs it. Every other CLI test forks
a warm interpreter instead (conftest.run_cli, tests/warm_python.py); these few keep the fresh
path covered and check that a warm fork reports the same as a fresh interpreter."""

from __future__ import annotations

import json
import os
import textwrap

import warm_python
from conftest import FIXTURES, run_cli, run_cli_fresh
from fixture_marks import read_marks
from reliability_helpers import validate

ZERO_GRAD = os.path.join(FIXTURES, "zero_grad")
BUGGY = "bad_missing_zero_grad_basic.py"
CLEAN = "good_basic_loop.py"

PRINTING = textwrap.dedent("""\
    import os, subprocess, sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4):
        print("print from the script", i)
        os.write(1, b"written to file descriptor 1\\n")
        subprocess.run(["echo", "a child process writes to stdout"])
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()  # no zero_grad
        opt.step()
""")


def _line_of_mark(name: str) -> int:
    [expectation], _ = read_marks(os.path.join(ZERO_GRAD, name))
    return expectation.line


def test_a_buggy_script_in_text_exits_1():
    result = run_cli_fresh("check", BUGGY, cwd=ZERO_GRAD)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"missing-zero-grad  {BUGGY}:{_line_of_mark(BUGGY)}" in result.stdout
    assert "Traceback" not in result.stderr + result.stdout


def test_a_clean_script_exits_0():
    result = run_cli_fresh("check", CLEAN, "--format", "json", cwd=ZERO_GRAD)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = validate(json.loads(result.stdout))
    assert (report["run"]["status"], report["run"]["steps"]) == ("completed", 10)
    assert report["summary"]["error"] == report["summary"]["warning"] == 0, report["findings"]
    assert report["internal_errors"] == []
    assert "Traceback" not in result.stderr


def test_json_on_stdout_stays_pure_and_a_warm_fork_reports_the_same(tmp_path):
    (tmp_path / "train.py").write_text(PRINTING)
    fresh = run_cli_fresh("check", "train.py", "-f", "json", cwd=tmp_path)
    report = validate(json.loads(fresh.stdout))  # all of stdout is the report
    assert fresh.returncode == 1, fresh.stderr[-3000:]
    assert report["run"]["status"] == "completed" and report["run"]["steps"] == 4
    assert [(f["rule"], f["location"]["line"]) for f in report["findings"]] == [("missing-zero-grad", 11)]
    for what in ("print from the script", "written to file descriptor 1",
                 "a child process writes to stdout"):
        assert fresh.stderr.count(what) == 4, fresh.stderr[-3000:]
    warm = run_cli("check", "train.py", "-f", "json", cwd=tmp_path)
    assert warm_python.last_run == "warm"
    assert (warm.returncode, warm.stderr) == (fresh.returncode, fresh.stderr)
    warm_report = json.loads(warm.stdout)
    for data in (warm_report, report):
        data["run"].pop("duration_s")
    # named field by field: this has failed once under heavy load, on the run section
    differing = {key: (warm_report["run"].get(key), report["run"].get(key))
                 for key in warm_report["run"].keys() | report["run"].keys()
                 if warm_report["run"].get(key) != report["run"].get(key)}
    assert not differing, differing
    assert warm_report == report


def test_a_usage_error_exits_2_before_anything_runs(tmp_path):
    result = run_cli_fresh("check", "nope.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "graddoctor: error: no such file: nope.py"
    assert result.stdout == ""
