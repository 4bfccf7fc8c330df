"""Command line: parses, builds options, dispatches. No decisions here, no torch import at the
top (``--help``, ``rules`` and ``explain`` stay instant).

The options of ``check`` are the rows of the option table (options.py); the report formats are
the registry's (report/formats.py)."""

from __future__ import annotations

import inspect
import os
import sys
from typing import Annotated, List, Optional

import typer

from .options import CONFIG_KEYS, OPTIONS, SCRIPT_OPTIONS, Option
from .report.formats import FORMATS, RenderOptions, ReportFormat

SCRIPT_SUFFIXES = (".py", ".pyw", ".ipynb")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="A doctor for PyTorch training loops: replays your script for a few optimizer steps "
    "and reports the gradient bugs that never crash.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _usage_error(message: str) -> None:
    typer.echo(f"graddoctor: error: {message}", err=True)
    raise typer.Exit(2)


def _typer_parameter(option: Option) -> inspect.Parameter:
    """A command-line option made from its row in the option table (options.py)."""
    kind = option.kind
    info = typer.Option(*option.flags, help=option.help, **kind.cli())
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY,
                             default=kind.cli_default(option.default),
                             annotation=Annotated[kind.annotation, info])


def _with_table_options(command):
    """Give ``command`` (which takes them as ``**typed``) every option of the table, in its
    order, as typer reads a signature."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = signature.replace(
        parameters=[*own, *(_typer_parameter(o) for o in OPTIONS.values())])
    return command


@app.command()
@_with_table_options
def check(
    ctx: typer.Context,
    script: str = typer.Argument(
        ..., help="The training script, a .ipynb notebook (its code cells in order), or with -m "
        "a module name."),
    script_args: Optional[List[str]] = typer.Argument(
        None, help="Arguments for the script; put them after `--`.", show_default=False),
    **typed,
) -> None:
    r"""Run SCRIPT under graddoctor and report its gradient bugs.

    Settings come from \[tool.graddoctor] in the closest pyproject.toml above the script, then
    from the options typed here. Exit codes: 0 no finding at or above --fail-on, 1 findings,
    2 could not check. Example: graddoctor check train.py -- --epochs 1
    """
    fmt, output = FORMATS[typed["format"]], typed["output"]
    for option in (OPTIONS["output"], OPTIONS["trace"]):
        if typed[option.name]:
            _check_writable(typed[option.name], option.flag)
    if not typed["module"] and not script.endswith(SCRIPT_SUFFIXES) and os.path.isfile(script):
        _usage_error(f"{script} is not a Python script (expected a .py file or a .ipynb notebook)")
    options = _options(script, script_args, typed, _given(ctx),
                       redirect_stdout=fmt.machine and output is None)
    render = RenderOptions(to_terminal=output is None, grad_flow=typed["grad_flow"])

    def on_hang(report) -> None:  # from the watchdog: the script is stuck; report, then end
        try:
            _emit(report, fmt, output, render)
            code = report.exit_code(options.fail_on)
        except BaseException:
            code = 2
        _hard_exit(code)

    def checkpoint(report) -> None:  # provisional, replaced by the final report
        _write(report, fmt, output, render)

    report = _run(options, on_hang, checkpoint if output else None)
    _emit(report, fmt, output, render)
    raise typer.Exit(report.exit_code(options.fail_on))


def _given(ctx: typer.Context) -> set[str]:
    """The options the user typed (a config value must not beat those, and only those)."""
    typed_sources = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may bundle its own click
    return {o.name for o in CONFIG_KEYS.values()
            if getattr(ctx.get_parameter_source(o.name), "name", None) in typed_sources}


def _options(script: str, script_args, typed: dict, given: set[str], redirect_stdout: bool):
    """The check's options: the library's own resolution (api.resolve_options: the option
    table's validation, [tool.graddoctor] under what the user typed); its errors are usage
    errors."""
    from .api import resolve_options
    from .errors import ScriptError

    values = {name: typed[name] for name in SCRIPT_OPTIONS}
    explicit = given | {name for name, o in SCRIPT_OPTIONS.items() if o.config_key is None}
    try:
        return resolve_options(script, tuple(script_args or ()), values, explicit,
                               source="library", redirect_stdout=redirect_stdout)
    except ScriptError as exc:
        _usage_error(str(exc))


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


def _write(report, fmt: ReportFormat, output: Optional[str], render: RenderOptions) -> None:
    """The report to --output (written whole, atomically) or stdout."""
    from .report.output import write_file, write_stdout

    text = fmt.render(report, render)
    if output:
        write_file(output, text)
    else:
        write_stdout(text)


def _emit(report, fmt: ReportFormat, output: Optional[str], render: RenderOptions) -> None:
    _write(report, fmt, output, render)
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
