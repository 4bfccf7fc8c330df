"""JSON report (docs/architecture.md, "Output contract"), versioned by ``schema_version``; its
JSON Schema is ``report.schema.json`` next to this module (``SCHEMA_PATH``)."""

from __future__ import annotations

import json
import os

from ..version import __version__
from ..jsonsafe import dumps
from ..rules import ALL_RULES
from .model import SCHEMA_VERSION, Report

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


def load_schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return json.load(f)


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
            "step_budget": run.step_budget,
            "backward_calls": run.backward_calls,
            "device": run.device,
            "torch_version": run.torch_version,
            "duration_s": run.duration_s,
            "error": run.error,
            "notes": run.notes,
            "config": run.config,
            "rules": _rules(report),
            "world_size": run.world_size,
            **({"ranks": run.ranks} if run.ranks is not None else {}),
            **({"checksums": run.checksums} if run.checksums else {}),
        },
        "findings": [f.to_json() for f in report.findings],
        "summary": {**report.summary(), "suppressed": len(report.suppressed())},
        "internal_errors": report.internal_errors,
    }


def _rules(report: Report) -> dict:
    skipped = report.run.rules_skipped
    return {"ran": len(ALL_RULES) - len(skipped), "total": len(ALL_RULES), "skipped": list(skipped)}


def render(report: Report) -> str:
    """The report as strict JSON (non-finite numbers as "nan", "inf", "-inf")."""
    return dumps(to_dict(report), indent=2) + "\n"
