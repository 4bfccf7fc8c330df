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
from ..notebook import cell_of, describe, is_notebook, python_lines

STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
CONTEXT_BEFORE, CONTEXT_AFTER = 2, 1


def _indent(renderable: RenderableType, by: int = 2) -> Padding:
    return Padding(renderable, (0, 0, 0, by))


def excerpt(path: str, line: int, base_dir: str | None = None) -> Syntax | None:
    """The reported line with a little context, highlighted and marked (❱); a relative path is
    relative to ``base_dir`` (default: the working directory)."""
    full = path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path)
    first = max(1, line - CONTEXT_BEFORE)
    number_from = first
    if is_notebook(full):  # the cell's code as it ran, numbered in the cell, not the JSON
        source = python_lines(full) or []
        here = cell_of(full, line)
        if here is None:
            return None
        span = [n for n in range(first, line + CONTEXT_AFTER + 1)
                if (cell_of(full, n) or (0,))[0] == here[0]]
        first, number_from = span[0], here[1] - (line - span[0])
        lines = [source[n - 1] if n <= len(source) else "" for n in span]
    else:
        lines = [linecache.getline(full, n) for n in range(first, line + CONTEXT_AFTER + 1)]
    while lines and not lines[-1]:
        lines.pop()  # past the end of the file
    if not lines or not lines[line - first:]:
        return None
    code = "".join(lines).rstrip("\n")
    return Syntax(code, "python", line_numbers=True, start_line=number_from,
                  highlight_lines={line - first + number_from},
                  theme="ansi_dark", word_wrap=True)


def where(finding: Finding) -> str:
    loc = finding.location
    return describe(loc.path, loc.line) if loc else "(no location in the code)"


def finding_block(f: Finding, base_dir: str | None = None) -> Group:
    head = Text.assemble((f.severity.value, STYLE[f.severity.value]), " ",
                         (f"{f.code} {f.rule}", "bold"), "  ", (where(f), "underline"))
    parts: list[RenderableType] = [head, _indent(Text(f.message))]
    from .merge import seen_on

    on = seen_on(f)
    if on:  # a report merged from several processes
        parts.insert(1, _indent(Text(f"seen on {on}", style="bold")))
    if f.location is not None:
        code = excerpt(f.location.path, f.location.line, base_dir)
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
        parts.append(_indent(Text(f"↳ {describe(r.location.path, r.location.line)}  {r.note}",
                                  style="dim")))
    if f.fix:
        parts.append(_indent(Text.assemble(("fix: ", "bold green"), f.fix)))
    auto = f.autofix
    if auto is not None and auto.edits and auto.verification is not None and not auto.verified:
        # re-running the fixed script refuted the edit: it is not on offer, whatever its safety
        why = auto.verification + (f": {auto.verification_note}" if auto.verification_note else "")
        parts.append(_indent(Text(f"autofix: none — the edit ({auto.title}) failed its check "
                                  f"({why})", style="dim")))
    elif auto is not None and auto.edits:
        state = "" if auto.verification is None else ", verified"
        parts.append(_indent(Text.assemble((f"autofix ({auto.safety.value}{state}): ", "green"),
                                           auto.title, (f" ({auto.verification_note})" if
                                                        auto.verification_note else "", "dim"))))
    elif auto is not None and auto.refused:
        parts.append(_indent(Text(f"autofix: none — {auto.refused}", style="dim")))
    parts.append(_indent(Text(f"see: graddoctor explain {f.rule}", style="dim")))
    return Group(*parts)


def suppressed_line(f: Finding) -> Text:
    return Text.assemble((f.severity.value, "dim"), " ", (f"{f.code} {f.rule}", "dim bold"), "  ",
                         (where(f), "dim"), ("  suppressed by # graddoctor: ignore", "dim"))


def severity_title(severity: Severity, count: int) -> Text:
    noun = {"error": "error", "warning": "warning", "info": "info"}[severity.value]
    plural = "s" if count != 1 and noun != "info" else ""
    return Text(f"{count} {noun}{plural}", style=STYLE[severity.value])
