"""``--format markdown``: the verdict and a compact findings table with file:line links, for a CI
job summary (``>> $GITHUB_STEP_SUMMARY``) or a review comment. GitHub-flavoured Markdown.

Links are relative to the repository root when the report runs there (the README's CI recipe);
``GITHUB_SERVER_URL``/``GITHUB_REPOSITORY``/``GITHUB_SHA``, when set (inside GitHub Actions),
make them absolute links to the lines of the commit checked.
"""

from __future__ import annotations

import os

from ..notebook import describe
from .model import Report


def _cell(text: str) -> str:
    """Text safe inside a table cell: no pipe, no newline, no HTML."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;").replace(">", "&gt;"))


def _link(path: str, line: int) -> str:
    where = _cell(describe(path, line))
    if os.path.isabs(path):
        return f"`{where}`"
    server, repo, sha = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY",
                                                      "GITHUB_SHA"))
    target = f"{server}/{repo}/blob/{sha}/{path}#L{line}" if server and repo and sha \
        else f"{path}#L{line}"
    return f"[`{where}`]({target.replace(' ', '%20').replace(')', '%29')})"


def render(report: Report) -> str:
    from .text import header_facts, verdict

    run = report.run
    out = [f"### graddoctor · `{_cell(run.script)}`", "",
           f"**{_cell(verdict(report).plain)}**", "",
           f"{_cell(header_facts(report))} · status `{run.status}`", ""]
    active = report.active()
    if active:
        out += ["| severity | rule | where | finding | fix |", "|---|---|---|---|---|"]
        for f in active:
            where = _link(f.location.path, f.location.line) if f.location else "—"
            seen = ""
            if f.ranks is not None or f.processes:
                from .merge import seen_on

                seen = f" (seen on {seen_on(f)})"
            out.append(f"| {f.severity.value} | `{f.code}` {f.rule} | {where} | "
                       f"{_cell(f.message)}{_cell(seen)} | {_cell(f.fix)} |")
        out.append("")
    suppressed = report.suppressed()
    if suppressed:
        out.append(f"{len(suppressed)} suppressed by `# graddoctor: ignore`: " +
                   ", ".join(f"`{f.code}` {_cell(describe(f.location.path, f.location.line)) if f.location else ''}"
                             for f in suppressed))
        out.append("")
    for note in run.notes:
        out.append(f"> note: {_cell(note)}")
    for err in report.internal_errors:
        out.append(f"> internal error in graddoctor ({_cell(err['where'])}): {_cell(err['error'])}")
    if active:
        out += ["", "<sub>`graddoctor explain RULE` says why each one matters; "
                "`-o report.html` draws the gradient flow.</sub>"]
    return "\n".join(out).rstrip() + "\n"
