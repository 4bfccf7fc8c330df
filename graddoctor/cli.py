"""Command line: parses, builds options, dispatches. No decisions here, no torch import at the
top (``--help``, ``rules`` and ``explain`` stay instant)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="A doctor for PyTorch training loops: replays your script for a few optimizer steps "
    "and reports the gradient bugs that never crash.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Format(str, Enum):
    text = "text"
    json = "json"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def _usage_error(message: str) -> None:
    typer.echo(f"graddoctor: error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def check(
    script: str = typer.Argument(..., help="The training script (or, with -m, a module name)."),
    script_args: Optional[List[str]] = typer.Argument(
        None, help="Arguments for the script; put them after `--`.", show_default=False),
    module: bool = typer.Option(False, "-m", "--module", help="Run SCRIPT as a module, like `python -m`."),
    steps: int = typer.Option(
        10, "--steps", min=0,
        help="Optimizer steps to replay (0 = run to the end). A DataLoader-driven script goes on "
        "until its third epoch has begun (two epoch boundaries), at most 2 x epoch-batches + 1 steps."),
    epoch_batches: int = typer.Option(
        17, "--epoch-batches", min=0,
        help="Batches per DataLoader epoch in the replay (0 = the real length). The default, 17, is "
        "larger than and not divisible by the common accumulation factors, so epoch-end bugs show."),
    timeout: float = typer.Option(600.0, "--timeout", help="Wall-clock limit in seconds (0 = none).", min=0),
    device: Device = typer.Option(Device.auto, "--device", help="auto: as the script decides; cpu: hide CUDA; cuda: require it."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Report format."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the report to this file instead of stdout."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", help="Exit 1 when a finding is at least this severe."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Also write the recorded events as JSON lines (for bug reports)."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Only these rules (slug or code prefix, repeatable)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip these rules (slug or code prefix, repeatable)."),
) -> None:
    """Run SCRIPT under graddoctor and report its gradient bugs.

    Exit codes: 0 no finding at or above --fail-on, 1 findings, 2 could not check.
    Example: graddoctor check train.py -- --epochs 1
    """
    from .options import CheckOptions

    for path, what in ((output, "--output"), (trace, "--trace")):
        if path:
            _check_writable(path, what)
    options = CheckOptions(
        target=script, args=tuple(script_args or ()), module=module, steps=steps,
        timeout=timeout or None, epoch_batches=epoch_batches, device=device.value, fail_on=fail_on.value,
        select=tuple(select or ()), ignore=tuple(ignore or ()), trace_path=trace,
        redirect_stdout=(fmt is not Format.text and output is None),
    )
    if not module and not script.endswith((".py", ".pyw")) and os.path.isfile(script):
        _usage_error(f"{script} is not a Python script (expected a .py file)")

    from .check import ScriptError, run_check

    try:
        report = run_check(options)
    except ScriptError as exc:
        _usage_error(str(exc))
        return
    text = _render(report, fmt, to_terminal=output is None)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    raise typer.Exit(report.exit_code(options.fail_on))


def _check_writable(path: str, what: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        _usage_error(f"{what} {path} is a directory")
    if not os.path.isdir(folder):
        _usage_error(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        _usage_error(f"{what} {path} is not writable")


def _render(report, fmt: Format, to_terminal: bool) -> str:
    if fmt is Format.json:
        from .report.json_format import render

        return render(report)
    from .report.text import render

    color = to_terminal and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    width = None
    if to_terminal:
        import shutil

        width = shutil.get_terminal_size((100, 24)).columns
    return render(report, width=width, color=color)


@app.command("rules")
def list_rules() -> None:
    """List every rule: code, slug, severity and what it finds."""
    from rich.console import Console
    from rich.table import Table

    from .rules import ALL_RULES

    table = Table(box=None, header_style="bold")
    for col in ("code", "slug", "severity", "finds"):
        table.add_column(col)
    for rule in ALL_RULES:
        table.add_row(rule.code, rule.slug, rule.severity.value, rule.summary)
    Console().print(table)


@app.command()
def explain(rule: str = typer.Argument(..., help="A rule slug (missing-zero-grad) or code (GD101).")) -> None:
    """Explain a rule: what it finds, why it is bad, an example and the fix."""
    from rich.console import Console
    from rich.markdown import Markdown

    from .rules import ALL_RULES, find_rule

    found = find_rule(rule)
    if found is None:
        known = ", ".join(r.slug for r in ALL_RULES)
        _usage_error(f"unknown rule {rule!r}; known rules: {known}")
        return
    Console().print(Markdown(f"# {found.code} {found.slug} ({found.severity.value})\n\n{found.docs()}"))


def main() -> None:
    app(prog_name="graddoctor")


if __name__ == "__main__":
    main()
