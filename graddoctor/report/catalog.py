"""The rule catalog as the light commands show it: ``graddoctor rules`` (a table, or JSON for
tools) and ``graddoctor explain`` (a rule's docs as Markdown). It describes the rules, never
decides anything."""

from __future__ import annotations

import json

from ..rules import ALL_RULES


def rules_json() -> str:
    """Every rule as {code, slug, severity, summary, fix, autofix}: autofix is the safety of its
    automatic fix, or null."""
    return json.dumps([{"code": r.code, "slug": r.slug, "severity": r.severity.value,
                        "summary": r.summary, "fix": r.fix,
                        "autofix": r.fix_safety.value if r.fix_safety else None}
                       for r in ALL_RULES], indent=2, ensure_ascii=False)


def rules_table():
    """Every rule as a rich table: code, slug, severity and what it finds."""
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("code", "slug", "severity", "finds"):
        # a slug is typed into --select/--ignore: the summary wraps, the slug is never cut
        table.add_column(col, no_wrap=col != "finds")
    for rule in ALL_RULES:
        table.add_row(rule.code, rule.slug, rule.severity.value, rule.summary)
    return table


def rule_markdown(rule) -> str:
    """``graddoctor explain``'s page of one rule: its docs, and why it has no automatic fix."""
    docs = rule.docs()
    if rule.fix_safety is None:
        docs += "\n\n## Automatic fix\nNone: the fix needs a person (`graddoctor check --diff` has nothing for it)."
    return f"# {rule.code} {rule.slug} ({rule.severity.value})\n\n{docs}"
