"""SARIF 2.1.0 (``--format sarif``) for code scanning (GitHub annotates the reported lines).

Every rule is described with its docs (``fullDescription``, ``help`` as text and Markdown);
each finding is a result with its location, its related locations and, when a
``# graddoctor: ignore`` covers it, an in-source suppression. Paths relative to the working
directory are written relative to ``%SRCROOT%`` (the repository root in CI), others as file URIs.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from ..version import __version__
from ..findings import Finding, Severity
from ..jsonsafe import dumps
from ..notebook import cell_of
from ..rules import ALL_RULES
from ..status import RunStatus
from .json_format import to_dict
from .model import Report

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
PROBLEM_SEVERITY = {Severity.ERROR: "error", Severity.WARNING: "warning",
                    Severity.INFO: "recommendation"}


def artifact_location(path: str) -> dict:
    if os.path.isabs(path):
        return {"uri": Path(path).as_uri()}
    return {"uri": quote(path.replace(os.sep, "/")), "uriBaseId": SRCROOT}


def physical_location(path: str, line: int | None = None) -> dict:
    out: dict = {"artifactLocation": artifact_location(path)}
    if line is not None and line >= 1:
        out["region"] = {"startLine": line}
    return out


def rule_descriptor(rule) -> dict:
    docs = rule.docs()
    what = rule.doc_section("What it does") or rule.summary
    markdown = docs
    if rule.fix:
        markdown += f"\n\n**Fix:** {rule.fix}"
    text = docs + (f"\n\nFix: {rule.fix}" if rule.fix else "")
    return {
        "id": rule.code,
        "name": rule.slug,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": what},
        "help": {"text": text, "markdown": markdown},
        "defaultConfiguration": {"level": LEVEL[rule.severity]},
        "properties": {
            "tags": ["pytorch", "training", "gradients", "correctness"],
            "precision": "high" if rule.severity is Severity.ERROR else "medium",
            "problem.severity": PROBLEM_SEVERITY[rule.severity],
        },
    }


def result(f: Finding, rule_index: dict[str, int], script: str | None) -> dict:
    message = f.message.rstrip()
    from .merge import seen_on

    on = seen_on(f)
    if on:  # a report merged from several ranks or workers
        message = f"[seen on {on}] {message}"
    if f.fix:
        message += ("" if message.endswith(".") else ".") + f" Fix: {f.fix}"
    out: dict = {
        "ruleId": f.code,
        "level": LEVEL[f.severity],
        "message": {"text": message},
    }
    if f.code in rule_index:
        out["ruleIndex"] = rule_index[f.code]
    if f.location is not None:
        out["locations"] = [{"physicalLocation": physical_location(f.location.path, f.location.line)}]
    elif script:  # no line in the code: annotate the script as a whole
        out["locations"] = [{"physicalLocation": physical_location(script)}]
    related = [{"id": n, "physicalLocation": physical_location(r.location.path, r.location.line),
                "message": {"text": r.note}} for n, r in enumerate(f.related, start=1)]
    if related:
        out["relatedLocations"] = related
    if f.suppressed:
        out["suppressions"] = [{"kind": "inSource",
                                "justification": "# graddoctor: ignore on the reported line"}]
    if f.autofix is not None and f.autofix.edits:
        out["fixes"] = [sarif_fix(f)]
    out["properties"] = {"rule": f.rule, "step": f.step, "evidence": f.evidence, "fix": f.fix}
    if f.ranks is not None or f.processes:
        out["properties"].update(ranks=list(f.ranks or ()), processes=list(f.processes))
    if f.location is not None:
        where = cell_of(f.location.path, f.location.line)
        if where is not None:  # the region is the line in the .ipynb file; this, the cell's
            out["properties"]["notebook"] = {"cell": where[0], "line": where[1]}
            out["message"]["text"] += f" (cell {where[0]}, line {where[1]})"
    return out


def sarif_fix(f: Finding) -> dict:
    """The finding's edit as a SARIF ``fix``: one ``artifactChange`` per file, each edit a
    ``replacement`` (SARIF columns count from 1; an insertion deletes an empty region)."""
    auto = f.autofix
    changes: dict[str, list] = {}
    for e in auto.edits:
        changes.setdefault(e.path, []).append({
            "deletedRegion": {"startLine": e.line, "startColumn": e.col + 1,
                              "endLine": e.end_line, "endColumn": e.end_col + 1},
            "insertedContent": {"text": e.text}})
    state = "not verified" if auto.verification is None else auto.verification
    return {"description": {"text": f"{auto.title} ({auto.safety.value}, {state})"},
            "artifactChanges": [{"artifactLocation": artifact_location(path), "replacements": reps}
                                for path, reps in changes.items()]}


def notifications(report: Report) -> list[dict]:
    out = []
    run = report.run
    if run.error:
        note: dict = {"level": "error" if report.exit_code() == 2 else "warning",
                      "message": {"text": f"the script stopped ({run.status}): "
                                          f"{run.error.get('type')}: {run.error.get('message')}"}}
        loc = run.error.get("location")
        if loc:
            note["locations"] = [{"physicalLocation": physical_location(loc["path"], loc["line"])}]
        out.append(note)
    if run.status is RunStatus.NO_TRAINING_LOOP:
        out.append({"level": "error", "message": {"text": "no backward() and no optimizer step were "
                                                          "seen: nothing to check"}})
    for err in report.internal_errors:
        out.append({"level": "warning",
                    "message": {"text": f"internal error in graddoctor ({err['where']}): {err['error']}"}})
    for text in run.notes:
        out.append({"level": "note", "message": {"text": text}})
    return out


def to_sarif(report: Report, base_dir: str | None = None) -> dict:
    rules = list(ALL_RULES)
    rule_index = {rule.code: n for n, rule in enumerate(rules)}
    script = report.run.script if report.run.script.endswith((".py", ".pyw", ".ipynb")) else None
    base = base_dir or report.base_dir or os.getcwd()
    plain = to_dict(report)
    run: dict = {
        "tool": {"driver": {
            "name": "graddoctor",
            "version": __version__,
            "semanticVersion": __version__,
            "rules": [rule_descriptor(r) for r in rules],
        }},
        "invocations": [{
            "executionSuccessful": report.exit_code() != 2,  # could not check, or incomplete
            "toolExecutionNotifications": notifications(report),
        }],
        "originalUriBaseIds": {SRCROOT: {"uri": Path(base).as_uri().rstrip("/") + "/"}},
        "results": [result(f, rule_index, script) for f in report.findings],
        "columnKind": "unicodeCodePoints",
        "properties": {"run": plain["run"], "summary": plain["summary"]},
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render(report: Report) -> str:
    """The SARIF log as strict JSON (non-finite numbers as "nan", "inf", "-inf")."""
    return dumps(to_sarif(report), indent=2) + "\n"
