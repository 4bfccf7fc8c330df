"""Command line: parses, builds options, dispatches. No decisions here, no torch import at the
top (``--help``, ``rules`` and ``explain`` stay instant)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import List, Optional

import typer

from .config import split_selectors
from .options import DEFAULT_EPOCH_BATCHES, DEFAULT_STEPS, DEFAULT_TIMEOUT, CheckOptions

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
    sarif = "sarif"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


# Options that [tool.graddoctor] may set; the command line overrides them when typed.
CONFIGURABLE = ("steps", "timeout", "device", "fail_on", "select", "ignore")


def _usage_error(message: str) -> None:
    typer.echo(f"graddoctor: error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def check(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script (or, with -m, a module name)."),
    script_args: Optional[List[str]] = typer.Argument(
        None, help="Arguments for the script; put them after `--`.", show_default=False),
    module: bool = typer.Option(False, "-m", "--module", help="Run SCRIPT as a module, like `python -m`."),
    steps: int = typer.Option(
        DEFAULT_STEPS, "--steps", min=0,
        help="Optimizer steps to replay (0 = run to the end). A DataLoader-driven script goes on "
        "until its third epoch has begun (two epoch boundaries), at most 2 x epoch-batches + 1 steps."),
    epoch_batches: int = typer.Option(
        DEFAULT_EPOCH_BATCHES, "--epoch-batches", min=0,
        help="Batches per DataLoader epoch in the replay (0 = the real length). The default, 17, is "
        "larger than and not divisible by the common accumulation factors, so epoch-end bugs show."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT, "--timeout", help="Wall-clock limit in seconds (0 = none).", min=0),
    device: Device = typer.Option(Device.auto, "--device", help="auto: as the script decides; cpu: hide CUDA; cuda: require it."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Report format: text (terminal), json, sarif (code scanning)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the report to this file instead of stdout."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", help="Exit 1 when a finding is at least this severe."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Also write the recorded events as JSON lines (for bug reports)."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Only these rules (slug or code prefix; repeatable or comma-separated)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip these rules (slug or code prefix; repeatable or comma-separated)."),
    grad_flow: bool = typer.Option(False, "--grad-flow", help="Text report: add the per-layer gradient norms of the last update."),
) -> None:
    """Run SCRIPT under graddoctor and report its gradient bugs.

    Settings come from [tool.graddoctor] in the closest pyproject.toml above the script, then
    from the options typed here. Exit codes: 0 no finding at or above --fail-on, 1 findings,
    2 could not check. Example: graddoctor check train.py -- --epochs 1
    """
    for path, what in ((output, "--output"), (trace, "--trace")):
        if path:
            _check_writable(path, what)
    if not module and not script.endswith((".py", ".pyw")) and os.path.isfile(script):
        _usage_error(f"{script} is not a Python script (expected a .py file)")
    command_line = dict(steps=steps, timeout=timeout, device=device.value, fail_on=fail_on.value,
                        select=split_selectors(select), ignore=split_selectors(ignore))
    settings, config_path = _settings(script, module, command_line, _given(ctx))
    options = CheckOptions(
        target=script, args=tuple(script_args or ()), module=module, steps=settings["steps"],
        timeout=settings["timeout"] or None, epoch_batches=epoch_batches, device=settings["device"],
        fail_on=settings["fail_on"],
        select=settings["select"], ignore=settings["ignore"], trace_path=trace,
        redirect_stdout=(fmt is not Format.text and output is None), config_path=config_path,
    )

    def on_hang(report) -> None:  # from the watchdog: the script is stuck; report, then end
        try:
            _emit(report, fmt, output, grad_flow)
            code = report.exit_code(options.fail_on)
        except BaseException:
            code = 2
        _hard_exit(code)

    def checkpoint(report) -> None:  # provisional, replaced by the final report
        _write(report, fmt, output, grad_flow)

    report = _run(options, on_hang, checkpoint if output else None)
    _emit(report, fmt, output, grad_flow)
    raise typer.Exit(report.exit_code(options.fail_on))


def _given(ctx: typer.Context) -> set[str]:
    """The options the user typed (a config value must not beat those, and only those)."""
    typed_sources = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may bundle its own click
    return {name for name in CONFIGURABLE
            if getattr(ctx.get_parameter_source(name), "name", None) in typed_sources}


def _settings(script: str, module: bool, command_line: dict, given: set[str]) -> tuple[dict, str | None]:
    """[tool.graddoctor] (searched from the script's folder upward) under the typed options."""
    from .analysis.run_rules import unknown_selectors
    from .config import ConfigError, load_config, merge

    start = os.getcwd() if module else os.path.dirname(os.path.abspath(script))
    try:
        config = load_config(start)
    except ConfigError as exc:
        _usage_error(str(exc))
    settings = merge(command_line, given, config)
    shown = _display(config.path) if config.path else None
    for key in ("select", "ignore"):
        unknown = unknown_selectors(settings[key])
        if unknown:
            where = f"--{key}" if key in given or key not in config.values else \
                f"{shown}: [tool.graddoctor] {key}"
            _usage_error(f"{where}: no rule is named {', '.join(map(repr, unknown))} "
                         "(use a slug or a code prefix; see `graddoctor rules`)")
    return settings, shown


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


def _run(options, on_hang=None, checkpoint=None):
    from .check import ScriptError, run_check
    from .report.progress import Progress

    label = options.target if options.module else os.path.basename(options.target)
    progress = Progress(label, options.steps or None)
    try:
        with progress:
            return run_check(options, on_step=progress.update, on_hang=on_hang,
                             checkpoint=checkpoint)
    except ScriptError as exc:
        _usage_error(str(exc))
    except Exception as exc:  # graddoctor's own failure: one line, the traceback on request
        if os.environ.get("GRADDOCTOR_DEBUG"):
            raise
        _usage_error(f"internal error: {type(exc).__name__}: {exc} (set GRADDOCTOR_DEBUG=1 for "
                     f"the traceback)")


def _write(report, fmt: Format, output: Optional[str], grad_flow: bool) -> None:
    """The report to --output (written whole, atomically) or stdout."""
    from .report.output import write_file, write_stdout

    text = _render(report, fmt, to_terminal=output is None, grad_flow=grad_flow)
    if output:
        write_file(output, text)
    else:
        write_stdout(text)


def _emit(report, fmt: Format, output: Optional[str], grad_flow: bool) -> None:
    _write(report, fmt, output, grad_flow)
    if output:
        from .report.text import verdict

        typer.echo(f"graddoctor: wrote {output}: {verdict(report).plain}", err=True)


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


def _render(report, fmt: Format, to_terminal: bool, grad_flow: bool = False) -> str:
    if fmt is Format.json:
        from .report.json_format import render

        return render(report)
    if fmt is Format.sarif:
        from .report.sarif import render

        return render(report)
    from .report.text import render, wants_color

    color = to_terminal and wants_color(sys.stdout)
    width = None
    if to_terminal:
        import shutil

        width = shutil.get_terminal_size((100, 24)).columns
    return render(report, width=width, color=color, grad_flow=grad_flow)


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
