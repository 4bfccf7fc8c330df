"""Command line: parses, resolves (options.py ``resolve``, the one resolver), calls (run/) and
renders. No decisions here, no torch import at the top (``--help``, ``rules`` and ``explain``
stay instant).

The options of ``check`` are the rows of the option table (options.py); the report formats are
the registry's (report/formats.py). How a check ends — the report written, a rank's handed to
rank 0 or gathered there — is run/finish.py's; ``merge`` joins files with report/merge.py."""

from __future__ import annotations

import inspect
import os
import sys
from typing import Annotated, List, Optional

import typer

from .options import CONFIG_KEYS, OPTIONS, SCRIPT_OPTIONS, Option
from .report.formats import FORMATS, RenderOptions

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # help texts are plain text: no rich markup, so that `[tool.graddoctor]` and any other
    # bracketed text in a help string is printed as written (tests/test_cli_help.py)
    rich_markup_mode=None,
    help="A doctor for PyTorch training loops: replays your script for a few optimizer steps "
    "and reports the gradient bugs that never crash.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _unknown(what: str, value: str, known) -> str:
    """"unknown rule 'missing-zero-grd' (did you mean 'missing-zero-grad'?)"."""
    from .errors import did_you_mean

    return f"unknown {what} {value!r}{did_you_mean(value, known)}"


def _show_version(value: bool) -> None:
    if value:
        from .version import __version__

        typer.echo(f"graddoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _graddoctor(version: Annotated[bool, typer.Option(
        "--version", "-V", help="Print graddoctor's version and exit.", is_eager=True,
        callback=_show_version)] = False) -> None:
    pass


def _usage_error(message: str) -> None:
    typer.echo(f"graddoctor: error: {message}", err=True)
    raise typer.Exit(2)


def _typer_parameter(option: Option) -> inspect.Parameter:
    """A command-line option made from its row in the option table (options.py)."""
    kind = option.kind
    flags = option.flags
    if option.negative_flags:  # "--grad-flow/--no-grad-flow": the config can switch it on
        flags = (f"{flags[0]}/{option.negative_flags[0]}", *flags[1:])
    info = typer.Option(*flags, help=option.help, **kind.cli())
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
    """Run SCRIPT under graddoctor and report its gradient bugs.

    Settings come from [tool.graddoctor] in the closest pyproject.toml above the script, then
    from the options typed here. Exit codes: 0 no finding at or above --fail-on, 1 findings,
    2 could not check. Example: graddoctor check train.py -- --epochs 1
    """
    shown_output = typed["output"]  # as typed, for messages
    fmt = FORMATS[_format_name(ctx, typed["format"], shown_output)]
    _refuse(script, typed["module"])
    from .run.finish import ending_for, rank_files
    from .run.ranks import rank_env

    ranks = rank_env()
    # 1 too: a torchrun-style script reads RANK, WORLD_SIZE and MASTER_ADDR from the launcher
    # (not again inside a launched rank: a world of one is not a "rank", rank_env says None)
    if typed["nproc_per_node"] >= 1 and ranks is None and "LOCAL_RANK" not in os.environ:
        from .run.ranks import launch

        raise typer.Exit(launch(typed["nproc_per_node"], _child_args(ctx, script, script_args)))
    if typed["plot"]:
        from .options import plot_problem

        problem = plot_problem(typed["plot"])  # named as typed
        if problem:
            _usage_error(problem)
    for name in ("output", "trace", "plot"):
        if typed[name]:  # where the user started: a script that changes directory moves no file
            typed[name] = os.path.abspath(typed[name])
    output = typed["output"]
    if ranks is not None:  # one rank of a distributed run: own files per rank
        output, typed["trace"] = rank_files(ranks, output, typed["trace"])
    for option, value in ((OPTIONS["output"], output), (OPTIONS["trace"], typed["trace"])):
        if value:
            _check_writable(value, option.flag)
    # a document on stdout (JSON, a page, --diff's patch): the script's own prints go to stderr
    to_stdout = (fmt.document and output is None) or typed["diff"]
    options, settings = _options(script, script_args, typed, _given(ctx),
                                 redirect_stdout=to_stdout,
                                 pictures=fmt.pictures or bool(typed["plot"]))
    if output is None or typed["diff"]:
        from .report.output import ReportStdout

        ReportStdout.keep()
    render = RenderOptions(to_terminal=output is None, grad_flow=settings["grad_flow"],
                           quiet=typed["quiet"])
    ending = ending_for(fmt, render, output, ranks=ranks, options=options, typed=typed["output"],
                        shown=shown_output, plot=typed["plot"])
    report = _run(ending, options)
    from .report.output import script_traceback

    traceback = script_traceback(report)
    if traceback:
        typer.echo(traceback, err=True)
    if ending.early_code is not None:  # reported at destroy_process_group(): that report is final
        raise typer.Exit(ending.end_early())
    if typed["diff"] or typed["fix"]:
        if ranks is not None:
            _usage_error("--diff/--fix check one process: run them without a distributed launch")
        from .run.fixes import act

        raise typer.Exit(act(report, options, ending, as_diff=typed["diff"],
                             verified_only=not typed["no_verify"], unsafe=typed["unsafe_fixes"]))
    raise typer.Exit(ending.finish(report))


def _refuse(script: str, module: bool) -> None:
    """A target refused at once, before torch is imported (scriptfile.py)."""
    from .scriptfile import refusal

    reason = refusal(script, module)
    if reason:
        _usage_error(reason)


def _child_args(ctx: typer.Context, script: str, script_args) -> list[str]:
    """The command line of ``check`` as typed, for each rank, without --nproc-per-node."""
    from .options import as_flags

    typed = {o.name: ctx.params.get(o.name) for o in OPTIONS.values() if o.name != "nproc_per_node"
             and getattr(ctx.get_parameter_source(o.name), "name", None) in _TYPED}
    return [*as_flags(typed), script, "--", *(script_args or ())]


_TYPED = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may bundle its own click


def _given(ctx: typer.Context) -> set[str]:
    """The options the user typed (a config value must not beat those, and only those)."""
    return {o.name for o in CONFIG_KEYS.values()
            if getattr(ctx.get_parameter_source(o.name), "name", None) in _TYPED}


def _format_name(ctx: typer.Context, typed: str, output: Optional[str]) -> str:
    """--format when typed; else the one the --output name asks for (.json, .sarif); else text."""
    from .report.formats import format_for_output

    if output and getattr(ctx.get_parameter_source("format"), "name", None) not in _TYPED:
        return format_for_output(output) or typed
    return typed


def _options(script: str, script_args, typed: dict, given: set[str], redirect_stdout: bool,
             pictures: bool = False):
    """The check's options and the settings they came from, through the one resolver
    (options.py ``resolve``: the option table's validation, [tool.graddoctor] under what the
    user typed), with --grad-flow, which only the text report reads; its errors are usage
    errors."""
    from .errors import ScriptError
    from .options import resolve

    values = {name: typed[name] for name in (*SCRIPT_OPTIONS, "grad_flow")}
    explicit = given | {name for name, o in OPTIONS.items() if o.config_key is None}
    try:
        resolved = resolve(script, tuple(script_args or ()), values, explicit, source="library",
                           redirect_stdout=redirect_stdout, pictures=pictures)
    except ScriptError as exc:
        _usage_error(str(exc))
    return resolved.options, resolved.settings


def _run(ending, options):
    """The check, run as ``ending`` (run/finish.py) says; its errors are usage errors."""
    from .errors import ScriptError

    try:
        return ending.run(options)
    except ScriptError as exc:
        _usage_error(str(exc))
    except Exception as exc:  # graddoctor's own failure: one line, the traceback on request
        if os.environ.get("GRADDOCTOR_DEBUG"):
            raise
        _usage_error(f"internal error: {type(exc).__name__}: {exc} (set GRADDOCTOR_DEBUG=1 for "
                     f"the traceback)")


def _check_writable(path: str, what: str) -> None:
    from .report.output import unwritable_reason

    reason = unwritable_reason(path)
    if reason:
        _usage_error(f"{what} {reason}")


@app.command("merge")
def merge_reports(
    reports: List[str] = typer.Argument(..., help="JSON reports of the ranks (graddoctor check "
                                        "--format json -o 'report.{rank}.json')."),
    format: Annotated[str, typer.Option("--format", "-f", help="Report format of the merged "
                                        "report: text, json, sarif, github, html or markdown (a page without the "
                                        "pictures: the ranks' JSON carries no per-step norms).")] = "text",
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Write the merged "
                                                  "report to this file.")] = None,
    fail_on: Annotated[str, typer.Option("--fail-on", help=OPTIONS["fail_on"].help)] = \
        OPTIONS["fail_on"].default,
    allow_incomplete: Annotated[bool, typer.Option(
        "--allow-incomplete", help=OPTIONS["allow_incomplete"].help)] = False,
) -> None:
    """Join the per-rank JSON reports of a distributed run into one report (each finding says
    on which ranks it was seen). Exit codes as for check; a rank without a report makes the
    run incomplete."""
    from .errors import ScriptError
    from .options import check_values
    from .report.merge import MergeError, merge_files
    from .report.output import emit_report

    try:  # the one resolver's validation (options.py), worded for the command line
        checked = check_values({"format": format, "fail_on": fail_on,
                                "allow_incomplete": allow_incomplete}, "library")
    except ScriptError as exc:
        _usage_error(str(exc))
    if output:
        _check_writable(output, "--output")
    try:
        merged = merge_files(reports, fail_on=checked["fail_on"],
                             allow_incomplete=checked["allow_incomplete"])
    except MergeError as exc:
        _usage_error(str(exc))
    emit_report(merged, FORMATS[checked["format"]], output, RenderOptions(to_terminal=output is None))
    raise typer.Exit(merged.exit_code())


@app.command("rules")
def list_rules(format: Annotated[str, typer.Option(
        "--format", "-f", help="text (a table) or json (a list of {code, slug, severity, summary, "
        "fix, autofix}: autofix is the safety of its automatic fix, or null), for tools.")] = "text") -> None:
    """List every rule: code, slug, severity and what it finds."""
    from .report.catalog import rules_json, rules_table

    if format not in ("text", "json"):
        _usage_error(_unknown("--format", format, ("text", "json")) + "; use text or json")
    if format == "json":
        typer.echo(rules_json())
    else:
        _console().print(rules_table())


def _console():
    """The console of the light commands: the terminal's width, else (a pipe, a file) the
    text report's 100 columns."""
    from rich.console import Console

    try:
        terminal = sys.stdout.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return Console() if terminal else Console(width=100)


@app.command()
def explain(rule: str = typer.Argument(..., help="A rule slug (missing-zero-grad) or code (GD101).")) -> None:
    """Explain a rule: what it finds, why it is bad, an example and the fix."""
    from rich.markdown import Markdown

    from .report.catalog import rule_markdown
    from .rules import ALL_RULES, find_rule

    found = find_rule(rule)
    if found is None:
        _usage_error(_unknown("rule", rule, [n for r in ALL_RULES for n in (r.slug, r.code)])
                     + "; `graddoctor rules` lists every rule")
        return
    _console().print(Markdown(rule_markdown(found)))


def main() -> None:
    import threading

    from .options import script_arguments_hint

    args = sys.argv[1:]
    if args in (["--version"], ["-V"]):
        from .version import __version__

        print(f"graddoctor {__version__}")
        sys.exit(0)
    try:
        code = app(args=args, prog_name="graddoctor", standalone_mode=False)
    except Exception as exc:  # click's own errors (typer may vendor click: match by class name)
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "NoArgsIsHelpError" in kinds:  # click >= 8.2 leaves the printing to its caller
            exc.show()
            code = 2
        elif "ClickException" in kinds:  # bad options: one line, like every other usage error
            message = exc.format_message()
            if "NoSuchOption" in kinds:  # click offers "--help" as a possible option: no help
                close = [p for p in getattr(exc, "possibilities", None) or () if p != "--help"]
                message = f"No such option: {exc.option_name}" + (
                    f" (did you mean {', '.join(close)}?)" if close else "")
            typer.echo(f"graddoctor: error: {message}", err=True)
            ctx = getattr(exc, "ctx", None)
            hint = script_arguments_hint(args, getattr(exc, "option_name", "")) \
                if "NoSuchOption" in kinds else None
            if hint:
                typer.echo(hint, err=True)
            elif ctx is not None:
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
        from .run.finish import hard_exit

        hard_exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
