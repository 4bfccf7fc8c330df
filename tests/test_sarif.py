"""SARIF output, validated against the official OASIS SARIF 2.1.0 schema (tests/data)."""

from __future__ import annotations

import copy
from dataclasses import replace
import hashlib
import json
import os

import jsonschema
import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from graddoctor.report import sarif
from graddoctor.report.sarif import to_sarif
from graddoctor.rules import ALL_RULES
from report_samples import (MISSING_ZERO_GRAD, MISSING_ZERO_GRAD_LINE, nonfinite_report, sample_report,
                            strict_json, write)

SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "data", "sarif-schema-2.1.0.json")
# sha256 of the errata01 OS schema text as published by OASIS (oasis-tcs/sarif-spec,
# Schemata/sarif-schema-2.1.0.json at commit 0a8091f7): the file is shipped byte for byte.
SCHEMA_SHA256 = "ddddcccbf95c7c50c037b5b07eff4140556278ca574ff374db46786b5fce7949"


@pytest.fixture(scope="module")
def validator():
    with open(SCHEMA_FILE, "rb") as f:
        raw = f.read()
    assert hashlib.sha256(raw).hexdigest() == SCHEMA_SHA256
    schema = json.loads(raw)
    assert schema["id"] == "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)


def errors(validator, doc) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_real_run_is_valid_sarif_pointing_at_the_bug(tmp_path, validator, monkeypatch):
    write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    monkeypatch.chdir(tmp_path)  # like CI: run from the repository root
    result = CliRunner().invoke(app, ["check", "train.py", "--format", "sarif", "-o", "out.sarif",
                                      "--steps", "3"])
    assert result.exit_code == 1, result.output
    assert "wrote out.sarif" in result.stderr
    with open(tmp_path / "out.sarif", encoding="utf-8") as f:
        doc = json.load(f)
    assert errors(validator, doc) == []
    run = doc["runs"][0]
    (res,) = run["results"]
    assert res["ruleId"] == "GD101" and res["level"] == "error"
    assert run["tool"]["driver"]["rules"][res["ruleIndex"]]["id"] == "GD101"
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == MISSING_ZERO_GRAD_LINE
    # the edit, as code scanning shows a suggested change
    (change,) = res["fixes"][0]["artifactChanges"]
    assert change["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert "zero_grad()" in change["replacements"][0]["insertedContent"]["text"]
    assert res["relatedLocations"] and all(r["message"]["text"] for r in res["relatedLocations"])
    assert "Fix: " in res["message"]["text"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.as_uri() + "/"
    assert run["invocations"][0]["executionSuccessful"] is True


def test_rules_carry_their_docs(tmp_path, validator):
    doc = to_sarif(sample_report(str(tmp_path)))
    rules = doc["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in ALL_RULES]
    for descriptor, rule in zip(rules, ALL_RULES):
        assert descriptor["name"] == rule.slug
        assert descriptor["shortDescription"]["text"] == rule.summary
        assert descriptor["fullDescription"]["text"] == rule.doc_section("What it does")
        assert "## Why is this bad?" in descriptor["help"]["markdown"]
        assert "## Use instead" in descriptor["help"]["text"]
        assert descriptor["defaultConfiguration"]["level"] in ("error", "warning", "note")


def test_every_kind_of_finding_and_a_crash_are_valid(tmp_path, validator):
    report = sample_report(str(tmp_path), status="crashed")
    doc = to_sarif(report, base_dir=str(tmp_path))
    assert errors(validator, doc) == []
    results = doc["runs"][0]["results"]
    by_code = {r["ruleId"]: r for r in results}
    assert by_code["GD102"]["suppressions"] == [
        {"kind": "inSource", "justification": "# graddoctor: ignore on the reported line"}]
    assert "suppressions" not in by_code["GD101"]
    assert by_code["GD103"]["level"] == "note"
    # no line in the code: the script as a whole
    assert by_code["GD103"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("train.py")
    assert "region" not in by_code["GD103"]["locations"][0]["physicalLocation"]
    # absolute paths become file URIs
    assert by_code["GD101"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("file://")
    notes = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert any("RuntimeError: boom" in n["message"]["text"] for n in notes)
    assert any("internal error in graddoctor" in n["message"]["text"] for n in notes)


def test_paths_with_spaces_are_uri_encoded(tmp_path, validator, monkeypatch):
    report = sample_report(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from graddoctor.findings import Finding, Severity
    from graddoctor.trace import Location

    report = replace(report, findings=[
        Finding("stale-grad", "GD103", Severity.WARNING, "m", Location("my dir/t ü.py", 3))])
    doc = to_sarif(report)
    uri = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20dir/t%20%C3%BC.py"
    assert errors(validator, doc) == []


def test_the_validator_catches_a_broken_log(tmp_path, validator):
    doc = to_sarif(sample_report(str(tmp_path)))
    broken = copy.deepcopy(doc)
    broken["runs"][0]["results"][0]["level"] = "fatal"
    assert errors(validator, broken)
    broken = copy.deepcopy(doc)
    del broken["version"]
    assert errors(validator, broken)


def test_nonfinite_evidence_is_strict_json_and_valid_sarif(tmp_path, validator, monkeypatch):
    """A GradScaler scale of inf (or a NaN norm) in a finding's evidence: no ``Infinity`` /
    ``NaN`` literal, which strict parsers and code-scanning uploads reject."""
    monkeypatch.chdir(tmp_path)
    text = sarif.render(nonfinite_report(str(tmp_path)))
    doc = strict_json(text)
    assert errors(validator, doc) == []
    run = doc["runs"][0]
    evidence = run["results"][0]["properties"]["evidence"]
    assert evidence["scale"] == "inf" and evidence["norms"] == ["nan", "-inf", 0.5]
    assert evidence["steps_by_scale"] == {"inf": 2, "nan": 1, "65536.0": 3}
