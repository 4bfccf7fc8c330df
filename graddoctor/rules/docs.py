"""The rules tables, generated from the rules themselves (nobody edits them by hand): the
docs/rules.md's table of rules (code, slug, severity, summary) and docs/architecture.md's table of
the correct patterns each rule stays silent on (its docstring's ``## Stays silent on``).

    python -m graddoctor.rules.docs            # print docs/rules.md's table
    python -m graddoctor.rules.docs --write    # regenerate both tables in place
    python -m graddoctor.rules.docs --check    # exit 1 when either table is out of date

Summaries stay plain text (``graddoctor rules``, SARIF); in the table, code in them is put in
backticks: a call such as ``optimizer.step()`` / ``zero_grad()``, and snake_case names such as
``no_grad``. Text already in backticks is kept as written; ``|`` is escaped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from . import ALL_RULES

HEADER = "| code | slug | severity | finds |\n|---|---|---|---|"
SECTION = "# Rules"
SILENT_HEADER = "| rule | stays silent on (correct look-alikes) |\n|---|---|"
SILENT_SECTION = "## Correct patterns the rules must not flag"

# `already code` | a call: name() / a.b.name() | a snake_case name (with its =value)
_CODE = re.compile(r"`[^`]*`|(?<![\w.`])(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*\(\)|(?<![\w.`])[A-Za-z]\w*_\w+(?:=\w+)?")


def markdown_summary(summary: str) -> str:
    """A rule's one-line summary as Markdown table-cell text."""
    text = _CODE.sub(lambda m: m.group(0) if m.group(0).startswith("`") else f"`{m.group(0)}`", summary)
    return text.replace("|", r"\|")


def rules_table(rules=ALL_RULES) -> str:
    """The Markdown table of the rules: code, slug, severity, finds (no trailing newline)."""
    rows = [f"| {r.code} | `{r.slug}` | {r.severity.value} | {markdown_summary(r.summary)} |" for r in rules]
    return "\n".join([HEADER, *rows])


def silent_table(rules=ALL_RULES) -> str:
    """The Markdown table of what each rule stays silent on (no trailing newline)."""
    rows = []
    for r in rules:
        text = " ".join(r.doc_section("Stays silent on").split()).replace("|", r"\|")
        rows.append(f"| `{r.slug}` | {text} |")
    return "\n".join([SILENT_HEADER, *rows])


def table_span(text: str, section: str = SECTION) -> tuple[int, int]:
    """Character span of the first table after the ``section`` heading (docs/rules.md's
    ``# Rules`` by default) of a Markdown text."""
    heading = re.search(rf"^{re.escape(section)}[ \t]*$", text, re.M)
    if heading is None:
        raise ValueError(f"no '{section}' heading")
    table = re.compile(r"(?:^\|.*(?:\n|\Z))+", re.M).search(text, heading.end())
    if table is None:
        raise ValueError(f"no table under '{section}'")
    return table.start(), table.end() - (1 if table.group(0).endswith("\n") else 0)


def readme_table(text: str) -> str:
    start, end = table_span(text)
    return text[start:end]


def with_table(text: str, rules=ALL_RULES) -> str:
    """The page's text with its rules table regenerated."""
    start, end = table_span(text)
    return text[:start] + rules_table(rules) + text[end:]


def architecture_table(text: str) -> str:
    start, end = table_span(text, SILENT_SECTION)
    return text[start:end]


def with_silent_table(text: str, rules=ALL_RULES) -> str:
    """docs/architecture.md's text with its table of correct look-alikes regenerated."""
    start, end = table_span(text, SILENT_SECTION)
    return text[:start] + silent_table(rules) + text[end:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(__file__).resolve().parents[2]
    if not args:
        print(rules_table())
        return 0
    if args[0] not in ("--write", "--check") or len(args) > 2:
        print("usage: python -m graddoctor.rules.docs [--write | --check] [docs/rules.md]", file=sys.stderr)
        return 2
    targets = [(Path(args[1]) if len(args) == 2 else root / "docs" / "rules.md", with_table)]
    if len(args) == 1:
        targets.append((root / "docs" / "architecture.md", with_silent_table))
    status = 0
    for path, regenerate in targets:
        text = path.read_text(encoding="utf-8")
        new = regenerate(text)
        if new == text:
            continue
        if args[0] == "--check":
            print(f"{path}: the rules table is out of date; run python -m graddoctor.rules.docs --write",
                  file=sys.stderr)
            status = 1
        else:
            path.write_text(new, encoding="utf-8")
            print(f"{path}: rules table regenerated")
    return status


if __name__ == "__main__":
    sys.exit(main())
