"""The JSON report (docs/architecture.md, "Output contract"), versioned by ``schema_version``;
its JSON Schema is ``report.schema.json`` next to this module (``SCHEMA_PATH``).

This module is the report's one wire format: what crosses a process or machine boundary (a
rank's report to rank 0, a spawned worker's to its parent, the files ``graddoctor merge``
joins) is this JSON, so every record is written and read back here, its reader beside its
writer. Not on the wire (the schema has no field for them and no view shows them): a
location's ``function``, a related line's ``via``/``hook``, and ``Finding.fixes`` (the analysis
has already put the fitting one in ``fix``). ``Finding.autofix`` (the edit) is ``autofix``:
``fix`` keeps its meaning, the text a person reads, as the output contract requires.
"""

from __future__ import annotations

import json
import os

from ..findings import Autofix, Edit, Finding, Related, Role, Safety, Severity
from ..jsonsafe import dumps
from ..notebook import location_json
from ..rules import ALL_RULES
from ..trace import Location
from ..version import __version__
from .model import SCHEMA_VERSION, Report, RunInfo

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


def load_schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return json.load(f)


def render(report: Report) -> str:
    """The report as strict JSON (non-finite numbers as "nan", "inf", "-inf")."""
    return dumps(to_dict(report), indent=2) + "\n"


# -- Report ------------------------------------------------------------------------------------

def to_dict(report: Report) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "graddoctor", "version": __version__},
        "run": run_to_dict(report),
        "findings": [finding_to_dict(f) for f in report.findings],
        "summary": {**report.summary(), "suppressed": len(report.suppressed())},
        "internal_errors": report.internal_errors,
    }


def from_dict(obj: dict) -> Report:
    """A report read back from its JSON (``graddoctor check --format json``)."""
    return Report(run=run_from_dict(obj["run"]),
                  findings=[finding_from_dict(f) for f in obj.get("findings", ())],
                  internal_errors=list(obj.get("internal_errors", ())))


# -- RunInfo -----------------------------------------------------------------------------------

def run_to_dict(report: Report) -> dict:
    run = report.run
    return {
        "script": run.script,
        "argv": run.argv,
        "status": run.status,
        "steps": run.steps,
        "step_budget": run.step_budget,
        **({"updates": run.updates} if run.updates is not None else {}),
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
        **({"batch_fingerprints": run.batch_fingerprints} if run.batch_fingerprints else {}),
        **({"run_id": run.run_id} if run.run_id else {}),
    }


def run_from_dict(run: dict) -> RunInfo:
    return RunInfo(
        script=run["script"], argv=list(run.get("argv", ())), status=run["status"],
        steps=run.get("steps", 0), backward_calls=run.get("backward_calls", 0),
        device=run.get("device", "cpu"), torch_version=run.get("torch_version", ""),
        duration_s=run.get("duration_s", 0.0), error=run.get("error"),
        notes=list(run.get("notes", ())), step_budget=run.get("step_budget"),
        config=run.get("config"), rules_skipped=list((run.get("rules") or {}).get("skipped", ())),
        world_size=run.get("world_size", 1), ranks=run.get("ranks"),
        checksums=run.get("checksums"), batch_fingerprints=run.get("batch_fingerprints"),
        updates=run.get("updates"), run_id=run.get("run_id"),
    )


def _rules(report: Report) -> dict:
    skipped = report.run.rules_skipped
    return {"ran": len(ALL_RULES) - len(skipped), "total": len(ALL_RULES), "skipped": list(skipped)}


# -- Finding -----------------------------------------------------------------------------------

def finding_to_dict(finding: Finding) -> dict:
    out = {
        "rule": finding.rule,
        "code": finding.code,
        "severity": finding.severity.value,
        "message": finding.message,
        "location": location_to_dict(finding.location),
        "related": [related_to_dict(r) for r in finding.related],
        "step": finding.step,
        "evidence": finding.evidence,
        "fix": finding.fix,
        "autofix": autofix_to_dict(finding.autofix),
        "suppressed": finding.suppressed,
    }
    if finding.ranks is not None or finding.processes:  # a report merged from several processes
        out["ranks"] = list(finding.ranks or ())
        out["processes"] = list(finding.processes)
    return out


def finding_from_dict(obj: dict) -> Finding:
    return Finding(
        rule=obj["rule"], code=obj["code"], severity=Severity(obj["severity"]),
        message=obj["message"], location=location_from_dict(obj.get("location")),
        fix=obj.get("fix", ""), related=tuple(related_from_dict(r) for r in obj.get("related", ())),
        step=obj.get("step"), evidence=dict(obj.get("evidence") or {}),
        suppressed=bool(obj.get("suppressed")),
        ranks=tuple(obj["ranks"]) if "ranks" in obj else None,
        processes=tuple(obj.get("processes", ())),
        autofix=autofix_from_dict(obj.get("autofix")),
    )


def autofix_to_dict(fix: Autofix | None) -> dict | None:
    """The finding's edit (``fix`` stays the text a person reads): its title, safety, the
    edits (lines from 1, columns from 0, the end exclusive), why there is none (``refused``)
    and its verification (``null``: not run; ``fixed``, ``not fixed``, ``fix introduced a
    finding``)."""
    if fix is None:
        return None
    return {
        "title": fix.title, "safety": fix.safety.value,
        "edits": [{"path": e.path, "line": e.line, "col": e.col, "end_line": e.end_line,
                   "end_col": e.end_col, "text": e.text} for e in fix.edits],
        "refused": fix.refused, "verification": fix.verification,
        "verification_note": fix.verification_note, "sha256": fix.digest,
    }


def autofix_from_dict(obj: dict | None) -> Autofix | None:
    if not obj:
        return None
    return Autofix(
        title=obj.get("title", ""), safety=Safety(obj.get("safety", "unsafe")),
        edits=tuple(Edit(e["path"], int(e["line"]), int(e["col"]), int(e["end_line"]),
                         int(e["end_col"]), e["text"]) for e in obj.get("edits", ())),
        refused=obj.get("refused", ""), verification=obj.get("verification"),
        verification_note=obj.get("verification_note", ""), digest=obj.get("sha256", ""),
    )


def related_to_dict(related: Related) -> dict:
    """A related line: its place, note and ``roles`` (what it is to the finding, as
    ``findings.Role`` values; absent when it has none). No ``via``/``hook``: only the finding's
    own line is shown as a framework's call."""
    loc = related.location
    out = {**location_json(loc.path, loc.line), "note": related.note}
    if related.roles:
        out["roles"] = [role.value for role in related.roles]
    return out


def related_from_dict(obj: dict) -> Related:
    """A related line read back; a role this version does not know is left out."""
    known = {role.value: role for role in Role}
    roles = tuple(known[r] for r in obj.get("roles", ()) if r in known)
    return Related(Location(obj["path"], int(obj["line"])), obj.get("note", ""), roles)


# -- Location ----------------------------------------------------------------------------------

def location_to_dict(loc: Location | None) -> dict | None:
    """``{path, line}``; in a notebook also ``cell``/``cell_line`` (derived from the line: the
    reader needs only the line); ``via``/``hook`` when the call came through a training
    framework."""
    if loc is None:
        return None
    out = location_json(loc.path, loc.line)
    if loc.via:
        out["via"] = loc.via
    if loc.hook:
        out["hook"] = loc.hook
    return out


def location_from_dict(obj: dict | None) -> Location | None:
    if not obj:
        return None
    return Location(obj["path"], int(obj["line"]), via=obj.get("via", ""), hook=obj.get("hook", ""))
