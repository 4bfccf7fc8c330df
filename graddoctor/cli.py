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
    steps: int = typer.Option(10, "--steps", help="Optimizer steps to replay (0 = run to the end).", min=0),
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
        timeout=timeout or None, device=device.value, fail_on=fail_on.value,
        select=tuple(select or ()), ignore=tuple(ignore or ()), trace_path=trace,
        redirect_stdout=(fmt is not Format.text and output is None),
    )
    if not module and not script.endswith((".py", ".pyw")) and os.path.isfile(script):
        _usage_error(f"{script} is not a Python script (expected a .py file)")

    from .check import ScriptError, run_check

    def emit(report) -> None:
        text = _render(report, fmt, to_terminal=output is None)
        if output:
            from .report.output import write_file

            write_file(output, text)
        else:
            from .report.output import write_stdout

            write_stdout(text)

    def on_hang(report) -> None:  # from the watchdog: the script is stuck; report, then end
        try:
            emit(report)
            code = report.exit_code(options.fail_on)
        except BaseException:
            code = 2
        _hard_exit(code)

    def checkpoint(report) -> None:  # provisional, replaced by the final report
        if output:
            emit(report)

    try:
        report = run_check(options, on_hang=on_hang, checkpoint=checkpoint if output else None)
    except ScriptError as exc:
        _usage_error(str(exc))
        return
    except Exception as exc:  # graddoctor's own failure: one line, the traceback on request
        if os.environ.get("GRADDOCTOR_DEBUG"):
            raise
        _usage_error(f"internal error: {type(exc).__name__}: {exc} (set GRADDOCTOR_DEBUG=1 for "
                     f"the traceback)")
        return
    emit(report)
    raise typer.Exit(report.exit_code(options.fail_on))


def _check_writable(path: str, what: str) -> None:
    from .report.output import unwritable_reason

    reason = unwritable_reason(path)
    if reason:
        _usage_error(f"{what} {reason}")


def _hard_exit(code: int) -> None:
    """End the process now: the script left a thread or a call that would keep it alive."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


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
    import threading

    try:
        code = app(prog_name="graddoctor", standalone_mode=False)
    except Exception as exc:  # click's own errors (typer may vendor click: match by class name)
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "NoArgsIsHelpError" in kinds:  # typer has printed the help already
            code = 2
        elif "ClickException" in kinds:  # bad options: one line, like every other usage error
            typer.echo(f"graddoctor: error: {exc.format_message()}", err=True)
            ctx = getattr(exc, "ctx", None)
            if ctx is not None:
                typer.echo(f"(see `{ctx.command_path} --help`)", err=True)
            code = exc.exit_code
        elif "Abort" in kinds:
            typer.echo("graddoctor: aborted", err=True)
            code = 1
        else:
            raise
    code = code if isinstance(code, int) else 0
    # a thread the script started and never stopped would keep the process alive after the report
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        _hard_exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
