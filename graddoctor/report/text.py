"""The terminal view (rich): header, findings with their source line, why and fix, verdict."""

from __future__ import annotations

import linecache
import os

from rich.console import Console, Group
from rich.padding import Padding
from rich.syntax import Syntax
from rich.text import Text

from ..findings import Finding
from .model import Report

STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
STATUS_TEXT = {
    "completed": "the script ran to its end",
    "step-limit": "stopped after the step budget",
    "timeout": "stopped by the time limit",
    "crashed": "the script raised an error",
    "no-training-loop": "no backward() and no optimizer step were seen",
}


def _excerpt(finding: Finding):
    loc = finding.location
    if loc is None:
        return None
    path = loc.path if os.path.isabs(loc.path) else os.path.abspath(loc.path)
    lines = [linecache.getline(path, n) for n in range(max(1, loc.line - 2), loc.line + 2)]
    if not any(lines):
        return None
    code = "".join(lines).rstrip("\n")
    return Syntax(code, "python", line_numbers=True, start_line=max(1, loc.line - 2),
                  highlight_lines={loc.line}, theme="ansi_dark", word_wrap=True)


def _finding(f: Finding) -> Group:
    where = f"{f.location.path}:{f.location.line}" if f.location else "(unknown location)"
    head = Text.assemble((f"{f.severity.value}", STYLE[f.severity.value]), " ",
                         (f"{f.code} {f.rule}", "bold"), "  ", (where, "underline"))
    if f.suppressed:
        head.append("  (suppressed)", style="dim")
    parts = [head, Padding(Text(f.message), (0, 0, 0, 2))]
    excerpt = _excerpt(f)
    if excerpt is not None:
        parts.append(Padding(excerpt, (0, 0, 0, 2)))
    for r in f.related:
        parts.append(Padding(Text(f"↳ {r.location.path}:{r.location.line}  {r.note}", style="dim"), (0, 0, 0, 2)))
    if f.fix:
        parts.append(Padding(Text.assemble(("fix: ", "bold green"), f.fix), (0, 0, 0, 2)))
    parts.append(Text(f"  see: graddoctor explain {f.rule}", style="dim"))
    return Group(*parts)


def render_to(console: Console, report: Report) -> None:
    run = report.run
    console.print(Text.assemble(("graddoctor", "bold"), f"  {run.script}"))
    console.print(
        f"device {run.device} · torch {run.torch_version} · {run.steps} optimizer steps · "
        f"{run.backward_calls} backward calls · {run.duration_s:.1f} s · "
        f"status {run.status} ({STATUS_TEXT.get(run.status, run.status)})",
        style="dim", highlight=False,
    )
    if run.error:
        loc = run.error.get("location") or {}
        where = f" at {loc.get('path')}:{loc.get('line')}" if loc else ""
        console.print(Text(f"script error{where}: {run.error.get('type')}: {run.error.get('message')}",
                           style="red"))
    for note in run.notes:
        console.print(Text(f"note: {note}", style="dim"))
    console.print()
    for f in report.findings:
        console.print(_finding(f))
        console.print()
    for err in report.internal_errors:
        console.print(Text(f"internal error in graddoctor ({err['where']}): {err['error']}", style="magenta"))
    counts = report.summary()
    if report.could_not_check():
        verdict = Text("✗ could not check this script", style="bold red")
    elif counts["error"] or counts["warning"]:
        verdict = Text.assemble(("✗ ", "bold red"), f"{counts['error']} error(s), {counts['warning']} warning(s), "
                                f"{counts['info']} info")
    else:
        verdict = Text.assemble(("✓ ", "bold green"), "no gradient bugs found"
                                + (f" ({counts['info']} info)" if counts["info"] else ""))
    suppressed = sum(f.suppressed for f in report.findings)
    if suppressed:
        verdict.append(f", {suppressed} suppressed", style="dim")
    console.print(verdict)


def render(report: Report, width: int | None = None, color: bool | None = None) -> str:
    console = Console(record=True, width=width or 100, force_terminal=bool(color),
                      no_color=not color, file=open(os.devnull, "w", encoding="utf-8"))
    render_to(console, report)
    text = console.export_text(styles=bool(color))
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
