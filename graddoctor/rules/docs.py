"""The rules table of docs/rules.md, generated from the rules themselves (nobody edits it by hand).

    python -m graddoctor.rules.docs            # print the table
    python -m graddoctor.rules.docs --write    # replace the table under `# Rules` in docs/rules.md
    python -m graddoctor.rules.docs --check    # exit 1 when docs/rules.md's table is out of date

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


def table_span(text: str) -> tuple[int, int]:
    """Character span of the first table after the ``# Rules`` (or ``## Rules``) heading of a page's text."""
    heading = re.search(rf"^#?{re.escape(SECTION)}[ \t]*$", text, re.M)
    if heading is None:
        raise ValueError(f"no '{SECTION}' heading")
    table = re.compile(r"(?:^\|.*(?:\n|\Z))+", re.M).search(text, heading.end())
    if table is None:
        raise ValueError(f"no table under '{SECTION}'")
    return table.start(), table.end() - (1 if table.group(0).endswith("\n") else 0)


def readme_table(text: str) -> str:
    start, end = table_span(text)
    return text[start:end]


def with_table(text: str, rules=ALL_RULES) -> str:
    """The page's text with its rules table regenerated."""
    start, end = table_span(text)
    return text[:start] + rules_table(rules) + text[end:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    readme = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
    if not args:
        print(rules_table())
        return 0
    if args[0] not in ("--write", "--check") or len(args) > 2:
        print("usage: python -m graddoctor.rules.docs [--write | --check] [docs/rules.md]", file=sys.stderr)
        return 2
    path = Path(args[1]) if len(args) == 2 else readme
    text = path.read_text(encoding="utf-8")
    new = with_table(text)
    if args[0] == "--check":
        if new != text:
            print(f"{path}: the rules table is out of date; run python -m graddoctor.rules.docs --write",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: rules table regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
