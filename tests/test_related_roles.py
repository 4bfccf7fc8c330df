"""Related locations carry a role (graddoctor/findings.py ``Role``): rules' autofixes find the
line to act on by it, never by the wording of a note, and it crosses the JSON wire."""

from __future__ import annotations

import ast
import glob
import json
import os

import jsonschema
import pytest

from conftest import ROOT
from graddoctor.findings import Finding, Related, Role, Severity
from graddoctor.report.json_format import (finding_from_dict, finding_to_dict, load_schema,
                                           related_from_dict, related_to_dict)
from graddoctor.rules.base import _merge_related
from graddoctor.rules.source import related_line
from graddoctor.trace import Location


def finding(*related: Related) -> Finding:
    return Finding(rule="missing-zero-grad", code="GD101", severity=Severity.ERROR,
                   message="m", location=Location("train.py", 10), related=related)


def test_every_related_line_call_names_roles_not_text():
    calls = []
    for path in glob.glob(os.path.join(ROOT, "graddoctor", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "related_line":
                calls.append(node)
                for arg in node.args[1:]:
                    assert isinstance(arg, ast.Attribute) and getattr(arg.value, "id", "") == "Role", \
                        f"{os.path.relpath(path, ROOT)}:{node.lineno}: related_line by {ast.unparse(arg)}"
    assert len(calls) >= 14


def test_the_line_is_found_by_role_whatever_the_note_says():
    f = finding(Related(Location("train.py", 4), "the step that applies them", (Role.BACKWARD,)),
                Related(Location("train.py", 7), "any wording at all", (Role.STEP,)))
    assert related_line(f, Role.STEP) == 7
    assert related_line(f, Role.UNSCALE) is None
    with pytest.raises(TypeError):
        related_line(f, "the step that applies")


def test_a_line_in_another_file_is_not_the_findings():
    f = finding(Related(Location("helpers.py", 7), "the step", (Role.STEP,)))
    assert related_line(f, Role.STEP) is None


def test_notes_joined_on_one_line_keep_both_roles():
    (merged,) = _merge_related([Related(Location("train.py", 7), "a", (Role.BACKWARD,)),
                                Related(Location("train.py", 7), "b", (Role.STEP,))])
    assert merged.note == "a; b" and merged.roles == (Role.BACKWARD, Role.STEP)
    assert related_line(finding(merged), Role.STEP) == 7


def test_roles_cross_the_wire_and_match_the_schema():
    f = finding(Related(Location("train.py", 7), "the step", (Role.STEP, Role.UNSCALE)),
                Related(Location("train.py", 8), "no role"))
    data = finding_to_dict(f)
    assert data["related"][0]["roles"] == ["step", "unscale"]
    assert "roles" not in data["related"][1]  # absent when none: older readers see no change
    assert finding_from_dict(json.loads(json.dumps(data))).related == f.related
    item = load_schema()["$defs"]["finding"]["properties"]["related"]["items"]
    for related in data["related"]:
        jsonschema.validate(related, item)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data["related"][0], "roles": ["Not A Role"]}, item)


def test_an_unknown_role_from_a_newer_writer_is_left_out():
    back = related_from_dict({"path": "train.py", "line": 3, "note": "n",
                              "roles": ["step", "from-the-future"]})
    assert back.roles == (Role.STEP,)
    assert related_to_dict(back)["roles"] == ["step"]
