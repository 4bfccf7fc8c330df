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

from .options import CONFIG_KEYS, OPTIONS, SCRIPT_OPTIONS, Flag, Option
from .report.formats import FORMATS, RenderOptions, ReportFormat

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
    if not typed["module"]:
        _refuse_unrunnable(script)
    from .run.ranks import rank_env, rank_path

    ranks = rank_env()
    # 1 too: a torchrun-style script reads RANK, WORLD_SIZE and MASTER_ADDR from the launcher
    # (not again inside a launched rank: a world of one is not a "rank", rank_env says None)
    if typed["nproc_per_node"] >= 1 and ranks is None and "LOCAL_RANK" not in os.environ:
        from .run.ranks import launch

        raise typer.Exit(launch(typed["nproc_per_node"], _child_args(ctx, script, script_args)))
    if typed["plot"]:
        _check_plot(typed["plot"])  # named as typed
    for name in ("output", "trace", "plot"):
        if typed[name]:  # where the user started: a script that changes directory moves no file
            typed[name] = os.path.abspath(typed[name])
    output = typed["output"]
    if ranks is not None:  # one rank of a distributed run: own files per rank
        if typed["trace"]:
            typed["trace"] = rank_path(typed["trace"], ranks.rank)
        if output and "{rank}" in output:
            output = rank_path(output, ranks.rank)
        elif ranks.rank != 0:
            output = None  # rank 0 writes the merged report
    for option, value in ((OPTIONS["output"], output), (OPTIONS["trace"], typed["trace"])):
        if value:
            _check_writable(value, option.flag)
    launcher = script in ("torch.distributed.run", "torch.distributed.launch") if typed["module"] \
        else os.path.basename(script) == "torchrun"
    if launcher:  # graddoctor goes under the launcher, or launches through it itself
        _usage_error(f"{script} is PyTorch's launcher: graddoctor runs inside each rank. Use "
                     f"`graddoctor check --nproc-per-node N train.py -- ARGS` or `torchrun "
                     f"--nproc-per-node N -m graddoctor check train.py -- ARGS` (see docs/distributed.md)")
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
    exchange = None
    if ranks is not None:  # where this rank runs, for rank 0 to see it gone (run/ranks.py)
        from .run.ranks import Exchange
        from .run.session import defer_teardown

        exchange = Exchange(ranks)
        exchange.register()
        defer_teardown()  # the script's objects outlive the rank's report (_end_unwaited)

    def finish(report, wait_s: float | None = None) -> int:
        _script_traceback(report)
        if ranks is not None:
            return _finish_rank(ranks, report, fmt, typed["output"], output, render, options, wait_s,
                                shown_output, exchange)
        _emit(report, fmt, output, render, shown_output)
        if typed["plot"]:
            _plot(report, typed["plot"])
        return report.exit_code()

    def on_hang(report) -> None:  # from the watchdog: the script is stuck; report, then end
        try:
            code = finish(report, wait_s=30.0)
        except BaseException:
            code = 2
        _hard_exit(code)

    def checkpoint(report) -> None:  # provisional, replaced by the final report
        _write(report, fmt, output, render)

    early: dict[str, int] = {}

    def on_destroy(report, destroy) -> None:
        """A rank's report at the script's destroy_process_group(), before its teardown
        (run/session.py ``_EarlyReport``): final, whatever that teardown does."""
        from .run.session import real_stdout

        if ranks.rank == 0:
            destroy()  # the group goes first: another rank's destroy may wait for rank 0's
        with real_stdout():  # the script's stdout goes to stderr while it runs
            early["code"] = _finish_rank(ranks, report, fmt, typed["output"], output, render,
                                         options, None, shown_output, exchange, early=True)

    report = _run(options, on_hang, checkpoint if output else None,
                  on_destroy if ranks is not None else None, quiet=typed["quiet"])
    if "code" in early:  # reported at destroy_process_group(): that report is final
        _end_unwaited()
        raise typer.Exit(early["code"])
    if typed["diff"] or typed["fix"]:
        if ranks is not None:
            _usage_error("--diff/--fix check one process: run them without a distributed launch")
        raise typer.Exit(_fixes(report, options, typed, fmt, output, render, shown_output))
    raise typer.Exit(finish(report))


def _fixes(report, options, typed, fmt, output, render, shown) -> int:
    """--diff / --fix: verify the fixes (run/fixes.py), then print the diff or write them."""
    from .run import fixes

    _script_traceback(report)
    unsafe = typed["unsafe_fixes"]
    if not typed["no_verify"]:
        report = fixes.verify(report, options, unsafe=unsafe)
    candidates = fixes.candidates(report, unsafe)
    for f in fixes.refused(report):
        where = f"{f.location.path}:{f.location.line}" if f.location else ""
        typer.echo(f"graddoctor: {f.code} {f.rule} {where}: no fix: {f.autofix.refused}", err=True)
    verified = sum(1 for f in candidates if f.autofix.verified)
    if typed["diff"]:
        from .report.output import write_stdout

        if output:
            _write(report, fmt, output, render)
        write_stdout(fixes.diff(report, candidates))
        typer.echo(f"graddoctor: {len(candidates)} fix{'es' if len(candidates) != 1 else ''} in "
                   f"the diff, {verified} verified by running the fixed script", err=True)
        return report.exit_code()
    import dataclasses

    chosen = fixes.to_apply(report, unsafe=unsafe, unverified=typed["no_verify"])
    # the report shows what is left, read against the file as it is before the edits
    left_report = dataclasses.replace(report, findings=[f for f in report.findings if f not in chosen])
    _emit(left_report, fmt, output, render, shown)
    done, skipped = fixes.write(report, chosen)
    for line in skipped:
        typer.echo(f"graddoctor: {line}", err=True)
    left = [f for f in candidates if f not in done]
    typer.echo(f"graddoctor: fixed {len(done)} finding{'s' if len(done) != 1 else ''}"
               + (f" ({sum(1 for f in done if f.autofix.verified)} verified)" if done else "")
               + (f"; {len(left)} fix{'es' if len(left) != 1 else ''} not applied (not verified, "
                  f"unsafe or overlapping: see --diff)" if left else ""), err=True)
    return dataclasses.replace(report, findings=[f for f in report.findings if f not in done]).exit_code()


def _refuse_unrunnable(script: str) -> None:
    """A file that is no Python script (notes.txt, a checkpoint) or does not compile is refused
    now, before torch is imported (scriptfile.py); a notebook is read where it runs."""
    from .errors import ScriptError
    from .notebook import is_notebook
    from .scriptfile import compile_script

    if is_notebook(script) or os.path.basename(script) == "torchrun":  # (the launcher: below)
        return
    try:
        compile_script(script)
    except ScriptError as exc:
        _usage_error(str(exc))


def _script_traceback(report) -> None:
    """A script that raised: its traceback on stderr before the report, as python prints it
    (the script's own frames), so that a crash under graddoctor is as debuggable as without."""
    error = report.run.error or {}
    text = error.get("traceback") or ""
    # graddoctor's own stop (a rank's SIGTERM) is no exception of the script's: python prints none
    ours = any(line.startswith("graddoctor.") for line in text.splitlines())
    if report.run.status == "crashed" and text and not ours:
        typer.echo("Traceback (most recent call last):\n" + error["traceback"].rstrip("\n"), err=True)


def _child_args(ctx: typer.Context, script: str, script_args) -> list[str]:
    """The command line of ``check`` as typed, for each rank, without --nproc-per-node."""
    out = []
    for option in OPTIONS.values():
        if option.name == "nproc_per_node":
            continue
        source = getattr(ctx.get_parameter_source(option.name), "name", None)
        value = ctx.params.get(option.name)
        if source not in ("COMMANDLINE", "ENVIRONMENT", "PROMPT") or value is None:
            continue
        if isinstance(option.kind, Flag):
            out += [option.flag] if value else []
        elif isinstance(value, (list, tuple)):
            for item in value:
                out += [option.flag, str(item)]
        else:
            out += [option.flag, str(getattr(value, "value", value))]
    return [*out, script, "--", *(script_args or ())]


def _finish_rank(ranks, report, fmt, typed_output, output, render, options,
                 wait_s: float | None = None, shown: str | None = None, exchange=None,
                 early: bool = False) -> int:
    """One rank's end (run/ranks.py): ranks other than 0 hand their report to rank 0 and exit
    0; rank 0 gets the run's report, merged from every rank's, writes it, and exits by it."""
    from .report.json_format import render as render_json
    from .report.text import verdict
    from .run.ranks import Exchange, gather, rank_path, rank_report

    per_rank = bool(typed_output) and "{rank}" in typed_output
    mine = rank_report(report, ranks)
    if per_rank:
        _write(mine, fmt, output, render)
    exchange = exchange or Exchange(ranks)
    if ranks.rank != 0:
        if not exchange.send(render_json(mine)) and not per_rank:
            fallback = rank_path(typed_output, ranks.rank) if typed_output else None
            if fallback:
                _write(mine, fmt, fallback, render)
            typer.echo(f"graddoctor: {ranks.label}: could not hand the report to rank 0 "
                       f"({exchange.error}); " + (f"wrote {fallback}" if fallback else
                                                 "its report follows on stderr"), err=True)
            if not fallback:
                typer.echo(FORMATS["text"].render(mine, RenderOptions()), err=True)
        if not early:  # (at destroy_process_group the script goes on: its end is not near)
            _end_unwaited()
        return 0  # never a failure code: the launcher would kill the ranks still reporting
    files = None
    if ranks.store is None and typed_output and fmt.name == "json":
        files = {r: rank_path(typed_output, r) for r in range(ranks.world_size)}
    merged = gather(exchange, report, options, wait_s, files)
    if per_rank:
        typer.echo(f"graddoctor: wrote {output} (and one per rank): {verdict(merged).plain}",
                   err=True)
    else:
        _emit(merged, fmt, output, render, shown)
    code = merged.exit_code()
    exchange.post_verdict(code)
    if not early:
        _end_unwaited()
    return code


def _end_unwaited() -> None:
    """A rank has handed over its report (rank 0: written the run's): the script's objects
    are let go of now (run/session.py held them), and if that teardown or the interpreter's
    hangs (a process group's destructor joining a gloo thread that waits for the GIL the main
    thread holds), a timer in C, which needs no GIL, ends the process: nobody waits for it.
    Its exit code (1) is not the run's: rank 0 posted the verdict, which
    ``--nproc-per-node``'s launcher returns."""
    import faulthandler

    from .run.ranks import teardown_grace
    from .run.session import release_deferred

    for stream in (sys.stdout, sys.stderr):  # the timer's exit flushes nothing
        try:
            stream.flush()
        except Exception:
            pass
    try:
        sink = open(os.devnull, "w")
        faulthandler.dump_traceback_later(teardown_grace(), exit=True, file=sink)
    except Exception:
        pass
    import threading

    if threading.current_thread() is threading.main_thread():  # not from the watchdog
        release_deferred()


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
    """The check's options and the settings they came from: the library's own resolution
    (api.resolve_settings: the option table's validation, [tool.graddoctor] under what the user
    typed), with --grad-flow, which only the text report reads; its errors are usage errors."""
    from .api import check_options, resolve_settings
    from .errors import ScriptError

    values = {name: typed[name] for name in (*SCRIPT_OPTIONS, "grad_flow")}
    explicit = given | {name for name, o in OPTIONS.items() if o.config_key is None}
    try:
        settings, shown = resolve_settings(script, values, explicit, source="library")
    except ScriptError as exc:
        _usage_error(str(exc))
    return check_options(script, tuple(script_args or ()), settings, shown,
                         redirect_stdout=redirect_stdout,
                         grad_flow=pictures or settings["grad_flow"]), settings


def _run(options, on_hang=None, checkpoint=None, on_destroy=None, quiet: bool = False):
    from .errors import ScriptError
    from .report.progress import Progress
    from .run.ranks import rank_env
    from .run.session import run_check

    label = options.target if options.module else os.path.basename(options.target)
    ranks = rank_env()
    if ranks is not None:
        label = f"{label} · rank {ranks.rank}"
    # ranks share one terminal: only rank 0 draws the status line
    progress = Progress(label, options.steps or None,
                        enabled=False if quiet or (ranks is not None and ranks.rank != 0) else None)
    import contextlib

    from .run.ranks import reporting_on_sigterm

    try:
        # a rank stopped by its launcher (SIGTERM) reports what it had, as rank 0 merges it
        with progress, reporting_on_sigterm() if ranks is not None else contextlib.nullcontext():
            return run_check(options, on_step=progress.update, on_hang=on_hang,
                             checkpoint=checkpoint, on_destroy=on_destroy)
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
        if fmt.document:  # what the script prints at exit (atexit) goes after it, to stderr
            from .report.output import ReportStdout

            ReportStdout.end_machine_output()


def _emit(report, fmt: ReportFormat, output: Optional[str], render: RenderOptions,
          shown: Optional[str] = None) -> None:
    """The report, then (with --output) a one-line verdict naming the file as it was typed."""
    _write(report, fmt, output, render)
    if output:
        from .report.text import verdict

        typer.echo(f"graddoctor: wrote {shown or output}: {verdict(report).plain}", err=True)


def _check_plot(path: str) -> None:
    """--plot: a picture format matplotlib writes, and matplotlib itself (an optional extra)."""
    from .report.plot import PLOT_SUFFIXES, missing_matplotlib

    if not path.lower().endswith(PLOT_SUFFIXES):
        _usage_error(f"--plot {path}: the file must end in {', '.join(PLOT_SUFFIXES)}")
    reason = missing_matplotlib()
    if reason:
        _usage_error(f"--plot: {reason}")
    _check_writable(path, "--plot")


def _plot(report, path: str) -> None:
    """The gradient-flow picture; its failure is a line on stderr, never the check's."""
    from .report.plot import plot

    try:
        plot(report, path)
        typer.echo(f"graddoctor: drew {path}", err=True)
    except Exception as exc:
        typer.echo(f"graddoctor: could not draw {path}: {type(exc).__name__}: {exc}", err=True)


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
    import json

    from .rules.engine import selected_rules
    from .report.json_format import from_dict
    from .findings import spans
    from .report.merge import Part, merge, missing_entry

    if format not in FORMATS:
        _usage_error(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    if fail_on not in OPTIONS["fail_on"].kind.choices:
        _usage_error(OPTIONS["fail_on"].error(fail_on, "library"))
    if output:
        _check_writable(output, "--output")
    import re

    parts, skipped, notes, unreadable = [], set(), [], {}  # skipped: rules the checks left out
    paths: dict[int, str] = {}  # id(part) -> its file
    for path in reports:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            report = from_dict(data)
        except OSError as exc:
            _usage_error(f"cannot read {path}: {exc.strerror or exc}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # one corrupt file (a rank killed while writing it) must not hide the others
            found = re.search(r"(\d+)\D*$", os.path.basename(path))
            why = f"unreadable report file {path} ({type(exc).__name__}: {exc})"
            if found:
                unreadable[int(found.group(1))] = why
            else:
                notes.append(why)
            continue
        skipped.update(report.run.rules_skipped)
        entries = report.run.ranks or []
        rank = entries[0]["rank"] if len(entries) == 1 else None
        parts.append(Part(report, rank, entries[0]["process"] if len(entries) == 1 else path))
        paths[id(parts[-1])] = path
    if not parts:
        _usage_error("none of the reports could be read: " + "; ".join(
            [*unreadable.values(), *notes]))
    if not all(p.report.run.ranks for p in parts):
        plain = [p for p in parts if not p.report.run.ranks]
        _usage_error(f"{plain[0].process} is the report of a single process, not of a rank "
                     "(write the ranks' reports under torchrun with -o 'report.{rank}.json')")
    runs: dict[tuple, list[str]] = {}  # one run only: the same command and run id
    for p in parts:
        run = p.report.run
        runs.setdefault((run.script, tuple(run.argv), run.run_id, run.world_size), []).append(
            paths[id(p)])
    if len({key[:2] for key in runs}) > 1 or len({key[2] for key in runs} - {None}) > 1 \
            or len({key[3] for key in runs}) > 1:
        groups = "; ".join(f"{', '.join(who)}: {' '.join([script, *argv])}"
                           f"{f' (run {run_id})' if run_id else ''}, world size {world}"
                           for (script, argv, run_id, world), who in runs.items())
        _usage_error(f"these reports are of different runs, which merge cannot join: {groups}")
    own = {p.rank for p in parts if p.rank is not None}
    kept = []
    for p in parts:  # a merged report (merge's own output in the glob) beside its ranks' files
        ranks_in = {e["rank"] for e in p.report.run.ranks}
        if p.rank is None and ranks_in & own:
            notes.append(f"{p.process} is a report merged before (rank {spans(sorted(ranks_in))}"
                         f"): left out, the ranks' own reports are given")
            continue
        kept.append(p)
    parts = kept
    by_rank: dict[int, Part] = {}
    for p in parts:
        for e in p.report.run.ranks:
            if e["rank"] is None:
                continue
            other = by_rank.get(e["rank"])
            if other is not None and other is not p:
                _usage_error(f"rank {e['rank']} is given twice ({paths[id(other)]} and "
                             f"{paths[id(p)]}): give each rank's report once")
            by_rank[e["rank"]] = p
    seen = set(by_rank)
    world = max(p.report.run.world_size for p in parts)
    missing = [missing_entry(r, f"rank {r}", unreadable.get(
        r, "no report file was given for this rank")) for r in range(world) if r not in seen]
    notes += [why for r, why in unreadable.items() if r in seen or r >= world]
    parts.sort(key=lambda p: (p.rank is None, p.rank or 0))
    merged = merge(parts, world_size=world, missing=missing, notes=notes, fail_on=fail_on,
                   allow_incomplete=allow_incomplete, rules=selected_rules(ignore=sorted(skipped)))
    fmt = FORMATS[format]
    _emit(merged, fmt, output, RenderOptions(to_terminal=output is None))
    raise typer.Exit(merged.exit_code())


@app.command("rules")
def list_rules(format: Annotated[str, typer.Option(
        "--format", "-f", help="text (a table) or json (a list of {code, slug, severity, summary, "
        "fix, autofix}: autofix is the safety of its automatic fix, or null), for tools.")] = "text") -> None:
    """List every rule: code, slug, severity and what it finds."""
    from rich.table import Table

    from .rules import ALL_RULES

    if format not in ("text", "json"):
        _usage_error(_unknown("--format", format, ("text", "json")) + "; use text or json")
    if format == "json":
        import json

        typer.echo(json.dumps([{"code": r.code, "slug": r.slug, "severity": r.severity.value,
                                "summary": r.summary, "fix": r.fix,
                                "autofix": r.fix_safety.value if r.fix_safety else None}
                               for r in ALL_RULES], indent=2, ensure_ascii=False))
        return

    table = Table(box=None, header_style="bold")
    for col in ("code", "slug", "severity", "finds"):
        # a slug is typed into --select/--ignore: the summary wraps, the slug is never cut
        table.add_column(col, no_wrap=col != "finds")
    for rule in ALL_RULES:
        table.add_row(rule.code, rule.slug, rule.severity.value, rule.summary)
    _console().print(table)


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

    from .rules import ALL_RULES, find_rule

    found = find_rule(rule)
    if found is None:
        _usage_error(_unknown("rule", rule, [n for r in ALL_RULES for n in (r.slug, r.code)])
                     + "; `graddoctor rules` lists every rule")
        return
    docs = found.docs()
    if found.fix_safety is None:
        docs += "\n\n## Automatic fix\nNone: the fix needs a person (`graddoctor check --diff` has nothing for it)."
    _console().print(Markdown(f"# {found.code} {found.slug} ({found.severity.value})\n\n{docs}"))


def _script_arguments_hint(args: list[str], option: str) -> str | None:
    """``graddoctor check train.py --lr 0.5``: options after the script are graddoctor's, so
    --lr is unknown; show the command with the script's arguments after ``--``."""
    import shlex

    from .options import split_script_arguments

    if not args or args[0] != "check":
        return None
    split = split_script_arguments(args[1:])
    if split is None or not split[1]:
        return None
    ours, script = split
    return (f"if {option or 'it'} is for the script: the script's arguments go after `--` "
            f"(options before it are graddoctor's):\n  graddoctor check "
            f"{shlex.join([*ours, '--', *script])}")


def main() -> None:
    import threading

    args = sys.argv[1:]
    if args in (["--version"], ["-V"]):
        from .version import __version__

        print(f"graddoctor {__version__}")
        sys.exit(0)
    try:
        code = app(args=args, prog_name="graddoctor", standalone_mode=False)
    except Exception as exc:  # click's own errors (typer may vendor click: match by class name)
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "NoArgsIsHelpError" in kinds:  # typer has printed the help already
            code = 2
        elif "ClickException" in kinds:  # bad options: one line, like every other usage error
            message = exc.format_message()
            if "NoSuchOption" in kinds:  # click offers "--help" as a possible option: no help
                close = [p for p in getattr(exc, "possibilities", None) or () if p != "--help"]
                message = f"No such option: {exc.option_name}" + (
                    f" (did you mean {', '.join(close)}?)" if close else "")
            typer.echo(f"graddoctor: error: {message}", err=True)
            ctx = getattr(exc, "ctx", None)
            hint = _script_arguments_hint(args, getattr(exc, "option_name", "")) \
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
        _hard_exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
