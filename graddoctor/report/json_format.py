"""JSON report (DESIGN §6), versioned by ``schema_version``."""

from __future__ import annotations

import json

from .. import __version__
from ..jsonsafe import json_safe
from .model import SCHEMA_VERSION, Report


def to_dict(report: Report) -> dict:
    run = report.run
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "graddoctor", "version": __version__},
        "run": {
            "script": run.script,
            "argv": run.argv,
            "status": run.status,
            "steps": run.steps,
            "backward_calls": run.backward_calls,
            "device": run.device,
            "torch_version": run.torch_version,
            "duration_s": run.duration_s,
            "error": run.error,
            "notes": run.notes,
        },
        "findings": [f.to_json() for f in report.findings],
        "summary": {**report.summary(), "suppressed": sum(f.suppressed for f in report.findings)},
        "internal_errors": report.internal_errors,
    }


def render(report: Report) -> str:
    return json.dumps(json_safe(to_dict(report)), indent=2, default=str, allow_nan=False) + "\n"
