"""One finding in the terminal: where, why, the source lines with the reported one marked, the
related places, the fix."""

from __future__ import annotations

import linecache
import os

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.syntax import Syntax
from rich.text import Text

from ..findings import Finding, Severity

STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
CONTEXT_BEFORE, CONTEXT_AFTER = 2, 1


def _indent(renderable: RenderableType, by: int = 2) -> Padding:
    return Padding(renderable, (0, 0, 0, by))


def excerpt(path: str, line: int) -> Syntax | None:
    """The reported line with a little context, highlighted and marked (❱)."""
    full = path if os.path.isabs(path) else os.path.abspath(path)
    first = max(1, line - CONTEXT_BEFORE)
    lines = [linecache.getline(full, n) for n in range(first, line + CONTEXT_AFTER + 1)]
    while lines and not lines[-1]:
        lines.pop()  # past the end of the file
    if not lines or not lines[line - first:]:
        return None
    code = "".join(lines).rstrip("\n")
    return Syntax(code, "python", line_numbers=True, start_line=first, highlight_lines={line},
                  theme="ansi_dark", word_wrap=True)


def where(finding: Finding) -> str:
    loc = finding.location
    return f"{loc.path}:{loc.line}" if loc else "(no location in the code)"


def finding_block(f: Finding) -> Group:
    head = Text.assemble((f.severity.value, STYLE[f.severity.value]), " ",
                         (f"{f.code} {f.rule}", "bold"), "  ", (where(f), "underline"))
    parts: list[RenderableType] = [head, _indent(Text(f.message))]
    if f.location is not None:
        code = excerpt(f.location.path, f.location.line)
        if code is not None:
            parts.append(_indent(code))
        if f.location.hook:  # a call the framework made for one of the user's hooks
            from ..frameworks import RETURNING, TITLES

            hook = f.location.hook
            what = f"what your {hook} returned" if hook in RETURNING else f"your {hook}"
            parts.append(_indent(Text(
                f"(the call is {TITLES.get(f.location.via, f.location.via)}'s own, made for {what})",
                style="dim")))
    for r in f.related:
        parts.append(_indent(Text(f"↳ {r.location.path}:{r.location.line}  {r.note}", style="dim")))
    if f.fix:
        parts.append(_indent(Text.assemble(("fix: ", "bold green"), f.fix)))
    parts.append(_indent(Text(f"see: graddoctor explain {f.rule}", style="dim")))
    return Group(*parts)


def suppressed_line(f: Finding) -> Text:
    return Text.assemble((f.severity.value, "dim"), " ", (f"{f.code} {f.rule}", "dim bold"), "  ",
                         (where(f), "dim"), ("  suppressed by # graddoctor: ignore", "dim"))


def severity_title(severity: Severity, count: int) -> Text:
    noun = {"error": "error", "warning": "warning", "info": "info"}[severity.value]
    plural = "s" if count != 1 and noun != "info" else ""
    return Text(f"{count} {noun}{plural}", style=STYLE[severity.value])
