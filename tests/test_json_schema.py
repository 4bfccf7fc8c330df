"""The JSON report against its own JSON Schema (graddoctor/report/report.schema.json)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from graddoctor.report import json_format
from graddoctor.report.json_format import SCHEMA_PATH, load_schema, to_dict
from report_samples import (CLEAN, CRASH, MISSING_ZERO_GRAD, UNUSED_LAYER, nonfinite_report, sample_report,
                            strict_json, write)


@pytest.fixture(scope="module")
def validator():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, doc) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_schema_ships_inside_the_package():
    assert SCHEMA_PATH.endswith("graddoctor/report/report.schema.json")
    assert load_schema()["properties"]["schema_version"]["const"] == 1


@pytest.mark.parametrize("source, comment, steps, exit_code, status", [
    (MISSING_ZERO_GRAD, "", "3", 1, "step-limit"),
    (MISSING_ZERO_GRAD, "  # graddoctor: ignore", "3", 0, "step-limit"),
    (UNUSED_LAYER, "", "3", 1, "step-limit"),
    (CLEAN, "", "0", 0, "completed"),
    (CRASH, "", "3", 2, "crashed"),
], ids=["error", "suppressed", "warning", "clean", "crash"])
def test_real_reports_are_valid(tmp_path, validator, source, comment, steps, exit_code, status):
    script = write(tmp_path, "train.py", source, comment)
    result = CliRunner().invoke(app, ["check", script, "--format", "json", "--steps", steps])
    assert result.exit_code == exit_code, result.output
    report = json.loads(result.stdout)
    assert errors(validator, report) == []
    assert report["run"]["status"] == status
    assert "done" not in result.stdout  # the script's prints went to stderr


def test_hand_made_report_with_every_field_is_valid(tmp_path, validator):
    doc = to_dict(sample_report(str(tmp_path), status="crashed"))
    assert errors(validator, doc) == []
    assert doc["summary"] == {"error": 1, "warning": 1, "info": 1, "suppressed": 1}


def test_the_schema_rejects_drift(tmp_path, validator):
    doc = to_dict(sample_report(str(tmp_path)))
    for mutate in (
        lambda d: d["run"].__setitem__("undocumented", 1),
        lambda d: d["findings"][0].__setitem__("severity", "fatal"),
        lambda d: d["findings"][0].pop("fix"),
        lambda d: d["summary"].pop("suppressed"),
        lambda d: d.__setitem__("schema_version", 2),
        lambda d: d["run"].pop("rules"),
        lambda d: d["run"]["rules"].__setitem__("skipped", ["stale-grad"]),
    ):
        broken = copy.deepcopy(doc)
        mutate(broken)
        assert errors(validator, broken), mutate


def test_nonfinite_evidence_is_strict_json_and_valid(tmp_path, validator):
    """NaN and ±inf as values and as keys of a finding's evidence: the strings "nan", "inf",
    "-inf", never a literal a strict parser rejects (and never a crash)."""
    doc = strict_json(json_format.render(nonfinite_report(str(tmp_path))))
    assert errors(validator, doc) == []
    evidence = doc["findings"][0]["evidence"]
    assert evidence["scale"] == "inf" and evidence["norms"] == ["nan", "-inf", 0.5]
    assert evidence["steps_by_scale"] == {"inf": 2, "nan": 1, "65536.0": 3}


def test_a_report_of_some_rules_says_which_did_not_run(tmp_path, validator):
    """--select GD2 gave a clean report that did not say that most rules never ran."""
    from graddoctor.rules import ALL_RULES

    script = write(tmp_path, "train.py", CLEAN)
    result = CliRunner().invoke(app, ["check", script, "-f", "json", "--steps", "2",
                                      "--select", "GD2", "--ignore", "GD201"])
    report = json.loads(result.stdout)
    assert errors(validator, report) == []
    ran = [r.code for r in ALL_RULES if r.code.startswith("GD2") and r.code != "GD201"]
    assert report["run"]["rules"] == {"ran": len(ran), "total": len(ALL_RULES),
                                      "skipped": [r.code for r in ALL_RULES if r.code not in ran]}
