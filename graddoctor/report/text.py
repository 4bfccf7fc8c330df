"""The terminal view (rich): header, findings by severity (source line, why, fix), suppressed
ones, the observed update timeline, optionally the per-layer gradient flow, a one-line verdict.

``render_to(console, report)`` draws on any Console (tests use ``Console(file=StringIO())``);
``render(report, width, color)`` returns the text, plain unless ``color``.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.padding import Padding
from rich.rule import Rule
from rich.text import Text

from ..findings import Severity
from ..notebook import describe
from ..rules import ALL_RULES
from ..status import RunStatus
from .model import Report
from .text_findings import STYLE, finding_block, severity_title, suppressed_line
from .text_gradflow import grad_flow_view
from .text_timeline import timeline_table

STATUS_TEXT = {
    RunStatus.COMPLETED: "the script ran to its end",
    RunStatus.STEP_LIMIT: "stopped after the step budget",
    RunStatus.BACKWARD_LIMIT: "stopped: many backward calls and no optimizer step",
    RunStatus.TIMEOUT: "stopped by the time limit",
    RunStatus.CRASHED: "the script raised an error",
    RunStatus.NO_TRAINING_LOOP: "no backward() and no optimizer step were seen",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def header_facts(report: Report) -> str:
    """``device cpu · torch 2.13.0 · 10/10 optimizer steps replayed · 10 backward calls``."""
    run = report.run
    updates = run.steps if run.updates is None else run.updates
    steps = _plural(run.steps, "optimizer step")
    if updates != run.steps:  # several optimizers per backward, or one per parameter
        steps += f" in {_plural(updates, 'update')}"
    steps += " replayed"
    if run.step_budget and updates > run.step_budget:
        # a DataLoader's two epoch ends, or an optimizer that had not stepped twice
        steps += f" (budget {run.step_budget}, run on to 2 epoch ends and 2 steps of each optimizer)"
    elif run.step_budget:
        steps = (f"{run.steps}/{run.step_budget} optimizer steps replayed" if updates == run.steps
                 else steps.replace(" replayed", f" replayed (budget {run.step_budget})"))
    facts = [f"device {run.device}", f"torch {run.torch_version}", steps,
             _plural(run.backward_calls, "backward call")]
    return " · ".join(facts)


def header(console: Console, report: Report) -> None:
    run = report.run
    console.print(Text.assemble(("graddoctor", "bold"), "  ", (run.script, "bold underline")))
    console.print(Padding(Text(header_facts(report), style="dim"), (0, 0, 0, 2)))
    said = STATUS_TEXT.get(run.status, run.status)
    if run.status == RunStatus.CRASHED and (run.error or {}).get("type") == "Missing":
        said = "a process's report never arrived (it ended before graddoctor could write it)"
    status = Text.assemble("  status ", (run.status, "bold"), f": {said} · {run.duration_s:.1f} s")
    if run.config:
        status.append(f" · config {run.config}", style="dim")
    console.print(status)
    if run.ranks:
        console.print(Padding(Text(ranks_line(run), style="dim"), (0, 0, 0, 2)))
    if run.error:
        loc = run.error.get("location") or {}
        at = f" at {describe(loc.get('path'), loc.get('line'))}" if loc else ""
        console.print(Padding(Text(f"script error{at}: {run.error.get('type')}: "
                                   f"{run.error.get('message')}", style="red"), (0, 0, 0, 2)))
    for note in run.notes:
        console.print(Padding(Text(f"note: {note}", style="dim"), (0, 0, 0, 2)))


def ranks_line(run) -> str:
    """``world size 2 · ranks 0–1: step-limit, 10 steps``: each process's status, grouped."""
    from .merge import spans

    groups: dict[tuple, list] = {}
    for e in run.ranks:
        key = (e["status"], e["steps"])
        groups.setdefault(key, []).append(e)
    parts = []
    for (status, steps), group in groups.items():
        ranks = [e["rank"] for e in group if e["rank"] is not None]
        names = (["rank " + spans(ranks)] if ranks else []) + \
            [e["process"] for e in group if e["rank"] is None]
        what = status if status == RunStatus.MISSING else f"{status}, {_plural(steps, 'step')}"
        parts.append(f"{', '.join(names)}: {what}")
    head = f"world size {run.world_size}" if run.world_size > 1 else \
        f"{len(run.ranks)} processes merged"
    return " · ".join([head, *parts])


def findings_section(console: Console, report: Report) -> None:
    active = report.active()
    for severity in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        group = [f for f in active if f.severity is severity]
        if not group:
            continue
        console.print()
        console.print(Rule(severity_title(severity, len(group)), style=STYLE[severity.value]))
        for n, f in enumerate(group):
            if n:
                console.print()
            console.print(finding_block(f, report.base_dir))
    suppressed = report.suppressed()
    if suppressed:
        console.print()
        console.print(Rule(Text(f"{len(suppressed)} suppressed", style="dim"), style="dim"))
        for f in suppressed:
            console.print(suppressed_line(f))


def timeline_section(console: Console, report: Report) -> None:
    table = timeline_table(report.analysis, report.findings)
    if table is None:
        return
    console.print()
    console.print(Rule(Text("update timeline: the order of calls in each update", style="bold"),
                       style="dim"))
    console.print(table)


def grad_flow_section(console: Console, report: Report) -> None:
    console.print()
    console.print(Rule(Text("gradient flow, last update", style="bold"), style="dim"))
    view = grad_flow_view(report.analysis)
    console.print(view if view is not None else
                  Text("no optimizer step with gradients was seen", style="dim"))


def _rules_tail(report: Report) -> str:
    """" · 7 of 16 rules ran (--select/--ignore)" when some rules were left out, else ""."""
    skipped = report.run.rules_skipped
    if not skipped:
        return ""
    return f" · only {len(ALL_RULES) - len(skipped)} of {len(ALL_RULES)} rules ran (--select/--ignore)"


def verdict(report: Report) -> Text:
    """The last line. Its mark agrees with the exit code: ✗ for 1 and 2, ✓ or ! for 0."""
    run = report.run
    counts = report.summary()
    suppressed = len(report.suppressed())
    rules = _rules_tail(report)
    if report.could_not_check():
        why = STATUS_TEXT[run.status] if run.status is RunStatus.NO_TRAINING_LOOP else \
            f"the script stopped ({run.status}) before its first backward or step"
        return Text.assemble(("✗ could not check: ", "bold red"), why)
    parts = [_plural(counts["error"], "error"), _plural(counts["warning"], "warning"),
             f"{counts['info']} info"]
    tail = f", {suppressed} suppressed" if suppressed else ""
    code = report.exit_code()
    if report.incomplete():
        if code == 2:  # the findings so far, but the check fails: the rest was never run
            return Text.assemble(("✗ incomplete ", "bold red"),
                                 f"({run.status} after {_plural(run.steps, 'optimizer step')}): "
                                 f"{', '.join(parts)} so far", (tail + rules, "dim"))
        tail += f" (the replay ended early: {run.status} after {_plural(run.steps, 'step')})"
    tail += rules
    if code:
        return Text.assemble(("✗ ", "bold red"), ", ".join(parts), (tail, "dim"))
    if counts["error"] or counts["warning"]:  # below the threshold: exit 0
        why = " (--fail-on never)" if report.fail_on == "never" else \
            f" (below --fail-on {report.fail_on})"
        return Text.assemble(("! ", "bold yellow"), ", ".join(parts), (why + tail, "dim"))
    found = f" ({', '.join(parts[2:])})" if counts["info"] else ""
    if run.steps == 0 and run.backward_calls == 0:  # gradients by torch.func: see the note
        return Text.assemble(("! ", "bold yellow"), f"nothing was checked: no backward() and no "
                             f"optimizer step (see the note){found}", (tail, "dim"))
    if run.steps == 0:  # backward calls and no optimizer step: the step checks had nothing to judge
        return Text.assemble(("! ", "bold yellow"),
                             f"no optimizer step in {_plural(run.backward_calls, 'backward call')}: "
                             f"the checks of what a step applies could not run{found}", (tail, "dim"))
    return Text.assemble(("✓ ", "bold green"),
                         f"no gradient bugs found in {_plural(run.steps, 'optimizer step')}{found}",
                         (tail, "dim"))


def render_to(console: Console, report: Report, grad_flow: bool = False, quiet: bool = False) -> None:
    """The report; ``quiet``: only the findings and the verdict."""
    if not quiet:
        header(console, report)
    findings_section(console, report)
    if report.internal_errors:
        console.print()
    for err in report.internal_errors:
        console.print(Text(f"internal error in graddoctor ({err['where']}): {err['error']}",
                           style="magenta"))
    if not quiet:
        timeline_section(console, report)
    if grad_flow:
        grad_flow_section(console, report)
    console.print()
    console.print(verdict(report))


def wants_color(stream) -> bool:
    """Color only on a terminal, and never with NO_COLOR set (no-color.org) or TERM=dumb."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def render(report: Report, width: int | None = None, color: bool | None = None,
           grad_flow: bool = False, quiet: bool = False) -> str:
    with open(os.devnull, "w", encoding="utf-8") as sink:
        console = Console(record=True, width=width or 100, force_terminal=bool(color),
                          no_color=not color, file=sink, highlight=False)
        render_to(console, report, grad_flow=grad_flow, quiet=quiet)
    text = console.export_text(styles=bool(color))
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
