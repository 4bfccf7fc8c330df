"""``--format github``: GitHub Actions workflow commands, one per finding
(``::error file=train.py,line=20,title=graddoctor GD102 partial-zero-grad::message``), as
ruff's ``--output-format github``. Printed in a workflow step, each becomes an annotation on
the line of the pull request, with no permission beyond the job's own (SARIF's code scanning
needs ``security-events: write``).

Severities map to ``error``, ``warning`` and ``notice``; suppressed findings are left out; a
run that could not be checked, or only in part, is one more ``error`` at the line the script
stopped at. The last line, plain text, is the verdict.
"""

from __future__ import annotations

from .model import Report

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _data(text: str) -> str:
    """A command's message: %, CR and LF escaped (the runner's own escaping)."""
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    """A command's property value: also : and , escaped."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, *, path: str | None = None, line: int | None = None,
            title: str | None = None) -> str:
    props = []
    if path:
        props.append(f"file={_property(path)}")
        if line:
            props.append(f"line={int(line)}")
    if title:
        props.append(f"title={_property(title)}")
    return f"::{level}{' ' + ','.join(props) if props else ''}::{_data(message)}"


def render(report: Report) -> str:
    from .text import verdict

    out = []
    for f in report.active():
        message = f.message + (f"\nfix: {f.fix}" if f.fix else "")
        if f.ranks is not None or f.processes:
            from .merge import seen_on

            message += f"\nseen on {seen_on(f)}"
        loc = f.location
        out.append(command(LEVEL.get(f.severity.value, "warning"), message,
                           path=loc.path if loc else None, line=loc.line if loc else None,
                           title=f"graddoctor {f.code} {f.rule}"))
    run = report.run
    if report.could_not_check() or report.incomplete():
        error = run.error or {}
        where = error.get("location") or {}
        what = f"{error.get('type')}: {error.get('message')}" if error else f"status {run.status}"
        how = "could not check" if report.could_not_check() else "checked only part of"
        out.append(command("error", f"graddoctor {how} {run.script} ({run.status}): {what}",
                           path=where.get("path"), line=where.get("line"),
                           title=f"graddoctor: {run.status}"))
    out.append(verdict(report).plain)
    return "\n".join(out) + "\n"
