"""Rules over the analysis: select them, run each, turn a rule's own failure into an internal
error (the other rules still run)."""

from __future__ import annotations

import dataclasses
import traceback

from ..findings import Finding
from ..analysis import Analysis
from ..trace import Trace
from . import ALL_RULES, Rule


def rule_matches(rule: type[Rule], pattern: str) -> bool:
    """A selector names a rule by slug (``stale-grad``) or by code prefix (``GD1``, ``GD103``)."""
    key = pattern.strip().lower()
    return bool(key) and (key == rule.slug or rule.code.lower().startswith(key))


def unknown_selectors(patterns) -> list[str]:
    """The selectors that name no rule at all (a typo the user wants to hear about)."""
    return [p for p in patterns if not any(rule_matches(r, p) for r in ALL_RULES)]


def selected_rules(select=(), ignore=()) -> list[type[Rule]]:
    def matches(rule, patterns):
        return any(rule_matches(rule, p) for p in patterns)

    rules = [r for r in ALL_RULES if not select or matches(r, select)]
    return [r for r in rules if not matches(r, ignore)]


def analyze(trace: Trace | Analysis, rules=None) -> tuple[list[Finding], list[dict]]:
    """Findings (sorted by severity, then place) and internal errors of the rules."""
    analysis = trace if isinstance(trace, Analysis) else Analysis(trace)
    findings: list[Finding] = []
    errors: list[dict] = []
    for rule in rules if rules is not None else ALL_RULES:
        try:
            findings.extend(_in_framework_terms(f, analysis.framework)
                            for f in rule().check(analysis))
        except Exception as exc:
            errors.append({"where": f"rule {rule.slug}",
                           "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()})
    findings.sort(key=lambda f: (-f.severity.rank, f.location.path if f.location else "",
                                 f.location.line if f.location else 0, f.code))
    return findings, errors


def _in_framework_terms(finding: Finding, run_framework: str) -> Finding:
    """A finding's fix in the terms of the framework its location came through
    (``Location.via``) or, failing that, of the one that drove the run, when the rule wrote a
    variant for it (``Rule.fixes`` / ``finding(fixes=...)``)."""
    if not finding.fixes:
        return finding
    via = (finding.location.via if finding.location is not None else "") or run_framework
    fix = finding.fixes.get(via) if via else None
    return finding if not fix or fix == finding.fix else dataclasses.replace(finding, fix=fix)
