"""Rules over the analysis: select them, run each, turn a rule's own failure into an internal
error (the other rules still run)."""

from __future__ import annotations

import dataclasses
import traceback

from ..findings import Autofix, Finding
from ..frameworks import TITLES
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


def selector_suggestions(unknown) -> str:
    """" (did you mean 'missing-zero-grad'?)" for each unknown selector close to a rule's slug or code."""
    from ..errors import did_you_mean

    names = [n for r in ALL_RULES for n in (r.slug, r.code)]
    return "".join(did_you_mean(p, names) for p in unknown)


def selected_rules(select=(), ignore=()) -> list[type[Rule]]:
    def matches(rule, patterns):
        return any(rule_matches(rule, p) for p in patterns)

    rules = [r for r in ALL_RULES if not select or matches(r, select)]
    return [r for r in rules if not matches(r, ignore)]


def analyze(trace: Trace | Analysis, rules=None, base_dir: str | None = None
            ) -> tuple[list[Finding], list[dict]]:
    """Findings (sorted by severity, then place) and internal errors of the rules. A finding of
    a rule with a mechanical fix carries its edit (``Finding.autofix``), built from the file
    its location names (relative to ``base_dir``, default the analysis's, else the working
    directory)."""
    analysis = trace if isinstance(trace, Analysis) else Analysis(trace, base_dir)
    base_dir = base_dir or analysis.source.base_dir
    findings: list[Finding] = []
    errors: list[dict] = []
    for rule in rules if rules is not None else ALL_RULES:
        try:
            found = [_in_framework_terms(f, analysis.framework) for f in rule().check(analysis)]
        except Exception as exc:
            errors.append({"where": f"rule {rule.slug}", "error": _error(exc)})
            continue
        if rule.fix_safety is not None:
            fixer = rule()
            for i, f in enumerate(found):
                try:
                    found[i] = _with_autofix(fixer, f, analysis.framework, base_dir)
                except Exception as exc:  # the finding stands, without its edit
                    errors.append({"where": f"fix of rule {rule.slug}", "error": _error(exc)})
        findings.extend(found)
    findings.sort(key=lambda f: (-f.severity.rank, f.location.path if f.location else "",
                                 f.location.line if f.location else 0, f.code))
    return findings, errors


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _with_autofix(rule: Rule, finding: Finding, run_framework: str,
                  base_dir: str | None) -> Finding:
    """The finding with the rule's edit, or with the reason it has none where the user would
    expect one (a notebook; code a training framework drives)."""
    from ..notebook import is_notebook
    from .source import load

    loc = finding.location
    if loc is None:
        return finding
    if is_notebook(loc.path):
        return dataclasses.replace(finding, autofix=Autofix(
            title="", safety=rule.fix_safety, refused="graddoctor does not edit notebooks: "
            "make the change in the cell the finding names"))
    src = load(loc.path, base_dir)
    fix = rule.autofix(finding, src) if src is not None else None
    if fix is not None:
        fix = dataclasses.replace(fix, digest=src.digest)
    framework = loc.via or run_framework
    if fix is None and framework:
        fix = Autofix(title="", safety=rule.fix_safety, refused=(
            f"no automatic edit: the calls sit in code that {TITLES.get(framework, framework)} "
            f"drives, where the change belongs in the framework's own terms (see the fix)"))
    return finding if fix is None else dataclasses.replace(finding, autofix=fix)


def _in_framework_terms(finding: Finding, run_framework: str) -> Finding:
    """A finding's fix in the terms of the framework its location came through
    (``Location.via``) or, failing that, of the one that drove the run, when the rule wrote a
    variant for it (``Rule.fixes`` / ``finding(fixes=...)``)."""
    if not finding.fixes:
        return finding
    via = (finding.location.via if finding.location is not None else "") or run_framework
    fix = finding.fixes.get(via) if via else None
    return finding if not fix or fix == finding.fix else dataclasses.replace(finding, fix=fix)
