"""`graddoctor rules` and `explain`: every rule documented in four sections."""

from __future__ import annotations

import pytest

from conftest import run_cli
from graddoctor.rules import ALL_RULES

SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.slug)
def test_rule_docs_have_four_sections(rule):
    for title in SECTIONS:
        assert rule.doc_section(title), f"{rule.slug}: missing section {title!r}"
    assert rule.summary and rule.fix
    assert rule.code.startswith("GD") and rule.slug == rule.slug.lower()


def test_codes_and_slugs_are_unique():
    assert len({r.code for r in ALL_RULES}) == len(ALL_RULES)
    assert len({r.slug for r in ALL_RULES}) == len(ALL_RULES)


def test_rules_lists_every_rule():
    out = run_cli("rules").stdout
    for rule in ALL_RULES:
        assert rule.code in out and rule.slug in out


def test_explain_by_slug_and_code():
    by_slug = run_cli("explain", "missing-zero-grad")
    by_code = run_cli("explain", "gd101")
    assert by_slug.returncode == by_code.returncode == 0
    assert "Why is this bad?" in by_slug.stdout and "zero_grad" in by_slug.stdout
    assert by_slug.stdout == by_code.stdout


def test_explain_unknown_rule():
    result = run_cli("explain", "no-such-rule")
    assert result.returncode == 2 and "unknown rule" in result.stderr
