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
    report = _run(options)
    _emit(report, fmt, output, grad_flow)
    raise typer.Exit(report.exit_code(options.fail_on))


def _given(ctx: typer.Context) -> set[str]:
    """The options the user typed (a config value must not beat those, and only those)."""
    typed_sources = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may bundle its own click
    return {name for name in CONFIGURABLE
            if getattr(ctx.get_parameter_source(name), "name", None) in typed_sources}


def _settings(script: str, module: bool, command_line: dict, given: set[str]) -> tuple[dict, str | None]:
    """[tool.graddoctor] (searched from the script's folder upward) under the typed options."""
    from .analyze import unknown_selectors
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


def _run(options):
    from .check import ScriptError, run_check
    from .report.progress import Progress

    label = options.target if options.module else os.path.basename(options.target)
    progress = Progress(label, options.steps or None)
    try:
        with progress:
            return run_check(options, on_step=progress.update)
    except ScriptError as exc:
        _usage_error(str(exc))


def _emit(report, fmt: Format, output: Optional[str], grad_flow: bool) -> None:
    text = _render(report, fmt, to_terminal=output is None, grad_flow=grad_flow)
    if not output:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    from .report.text import verdict

    typer.echo(f"graddoctor: wrote {output}: {verdict(report).plain}", err=True)


def _check_writable(path: str, what: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        _usage_error(f"{what} {path} is a directory")
    if not os.path.isdir(folder):
        _usage_error(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        _usage_error(f"{what} {path} is not writable")


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
    app(prog_name="graddoctor")


if __name__ == "__main__":
    main()
