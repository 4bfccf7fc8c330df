"""Shared by the tests/test_reliability_*.py files: the helper scripts, and one call that runs
the CLI with ``--output`` and returns the report, validated against its JSON Schema."""

from __future__ import annotations

import json
import os

import jsonschema

from conftest import ROOT, run_cli
from graddoctor.report.json_format import load_schema

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
MISBEHAVE = os.path.join(SCRIPTS, "misbehave.py")
STATUSES = ["completed", "step-limit", "timeout", "crashed", "no-training-loop"]


def validate(report: dict) -> dict:
    """The report against the JSON Schema that ships with graddoctor, plus the facts every
    report of a run must have (a status, locations with a line >= 1)."""
    jsonschema.Draft202012Validator(load_schema()).validate(report)
    assert report["run"]["status"] in STATUSES
    for finding in report["findings"]:
        assert finding["location"] is None or finding["location"]["line"] >= 1
    return report


def marked_line(path: str, mark: str = "# BUG-LINE") -> int:
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if mark in text:
                return number
    raise AssertionError(f"no {mark} in {path}")


# (args) -> (process result, report) of a run of a helper script: tests that assert different
# things about the same command read one process's result (see check_to_file)
_shared_runs: dict[tuple, tuple] = {}


def _shared(args, cwd, input, env) -> bool:
    """A run other tests of this process may read: a helper script of tests/scripts (files no
    test writes) started from the repository root, without input or extra environment."""
    scripts = [a for a in args if a.endswith(".py")]
    return (cwd is None and input is None and not env and bool(scripts)
            and all(os.path.dirname(os.path.abspath(a)) == SCRIPTS for a in scripts))


def check_to_file(out_dir, *args, cwd=None, timeout=180, input=None, **env):
    """``graddoctor check ARGS -f json -o OUT``: the process result and the report in the file,
    validated against the schema (the file must exist and be complete). The same command on a
    helper script of tests/scripts is run once per test process (the report file is not part
    of the run: a second test reads the first's result)."""
    share = _shared(args, cwd, input, env)
    if share and args in _shared_runs:
        return _shared_runs[args]
    out = os.path.join(str(out_dir), "report.json")
    if os.path.exists(out):
        os.remove(out)
    result = run_cli("check", "--format", "json", "--output", out, *args, cwd=cwd,
                     timeout=timeout, input=input, **env)
    assert os.path.exists(out), f"no report file; rc={result.returncode}\n{result.stderr[-3000:]}"
    with open(out, encoding="utf-8") as f:
        report = json.load(f)
    done = result, validate(report)
    if share:
        _shared_runs[args] = done
    return done


def findings_at(report: dict) -> list[tuple[str, int]]:
    return [(f["rule"], f["location"]["line"]) for f in report["findings"] if f["location"]]
