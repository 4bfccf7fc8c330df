"""Shared by the tests/test_reliability_*.py files: the report's JSON schema, the helper scripts,
and one call that runs the CLI with ``--output`` and returns the validated report."""

from __future__ import annotations

import json
import os

import jsonschema

from conftest import ROOT, run_cli

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
MISBEHAVE = os.path.join(SCRIPTS, "misbehave.py")
STATUSES = ["completed", "step-limit", "timeout", "crashed", "no-training-loop"]

_LOCATION = {
    "type": "object", "required": ["path", "line"],
    "properties": {"path": {"type": "string", "minLength": 1}, "line": {"type": "integer", "minimum": 1}},
}
REPORT_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "tool", "run", "findings", "summary", "internal_errors"],
    "properties": {
        "schema_version": {"type": "integer"},
        "tool": {"type": "object", "required": ["name", "version"]},
        "run": {
            "type": "object",
            "required": ["script", "argv", "status", "steps", "backward_calls", "device",
                         "torch_version", "duration_s", "error", "notes"],
            "properties": {
                "status": {"enum": STATUSES},
                "argv": {"type": "array", "items": {"type": "string"}},
                "steps": {"type": "integer", "minimum": 0},
                "backward_calls": {"type": "integer", "minimum": 0},
                "duration_s": {"type": "number", "minimum": 0},
                "error": {"oneOf": [{"type": "null"}, {
                    "type": "object", "required": ["type", "message", "location"],
                    "properties": {"type": {"type": "string", "minLength": 1},
                                   "message": {"type": "string"},
                                   "location": {"oneOf": [{"type": "null"}, _LOCATION]}},
                }]},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
        },
        "findings": {"type": "array", "items": {
            "type": "object",
            "required": ["rule", "code", "severity", "message", "location", "related", "step",
                         "evidence", "fix"],
            "properties": {
                "severity": {"enum": ["error", "warning", "info"]},
                "location": {"oneOf": [{"type": "null"}, _LOCATION]},
                "related": {"type": "array", "items": {
                    "type": "object", "required": ["path", "line", "note"],
                    "properties": {"line": {"type": "integer", "minimum": 1}}}},
                "step": {"type": ["integer", "null"]},
            },
        }},
        "summary": {"type": "object", "required": ["error", "warning", "info"]},
        "internal_errors": {"type": "array", "items": {"type": "object", "required": ["where", "error"]}},
    },
}


def validate(report: dict) -> dict:
    jsonschema.validate(report, REPORT_SCHEMA)
    return report


def marked_line(path: str, mark: str = "# BUG-LINE") -> int:
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if mark in text:
                return number
    raise AssertionError(f"no {mark} in {path}")


def check_to_file(out_dir, *args, cwd=None, timeout=180, input=None, **env):
    """``graddoctor check ARGS -f json -o OUT``: the process result and the report in the file,
    validated against the schema (the file must exist and be complete)."""
    out = os.path.join(str(out_dir), "report.json")
    if os.path.exists(out):
        os.remove(out)
    result = run_cli("check", "--format", "json", "--output", out, *args, cwd=cwd,
                     timeout=timeout, input=input, **env)
    assert os.path.exists(out), f"no report file; rc={result.returncode}\n{result.stderr[-3000:]}"
    with open(out, encoding="utf-8") as f:
        report = json.load(f)
    return result, validate(report)


def findings_at(report: dict) -> list[tuple[str, int]]:
    return [(f["rule"], f["location"]["line"]) for f in report["findings"] if f["location"]]
