"""How a check started by ``graddoctor check`` ends, once ``run_check`` has the report.

``Ending``: the report written where the user asked (a file or stdout) and the exit code it
gives; the provisional reports of a long run (``checkpoint``); the report of a script stuck past
its time limit, then the process ended (``on_hang``).

``RankEnding``: the same for one rank of a distributed run, with the rank's life around it
(run/ranks.py holds the exchange itself, ``Exchange``):

1. at its start the rank registers where it runs (for rank 0 to see it gone) and the script's
   teardown is deferred (run/session.py ``defer_teardown``: its objects outlive the report);
2. its report is final at the script's ``destroy_process_group()`` (``on_destroy``), else when
   the script ends (``finish``);
3. a rank other than 0 sends its report to rank 0 (or writes it: ``-o 'r.{rank}.json'``, or on
   stderr when it cannot) and exits 0; rank 0 gathers every rank's report, merges them, writes
   the run's report and posts its exit code, the verdict, for the launcher;
4. then the process is let go of without waiting for its teardown (``end_unwaited``).

The front door (cli.py) builds one and hands its callbacks to ``run_check``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from ..report.formats import FORMATS, RenderOptions, ReportFormat
from ..report.output import emit_report, say, write_report


def ending_for(fmt: ReportFormat, render: RenderOptions, output: str | None, *, ranks=None,
               options=None, typed: str | None = None, shown: str | None = None,
               plot: str | None = None) -> "Ending":
    """The ending of a check: a rank's (``ranks``: run/ranks.py ``RankEnv``) or a single
    process's. ``output``: the file this process writes (None: stdout); ``typed`` and
    ``shown``: --output absolute and as typed; ``plot``: --plot (not drawn by a rank)."""
    if ranks is not None:
        return RankEnding(fmt, render, output, ranks=ranks, options=options, typed=typed,
                          shown=shown)
    return Ending(fmt, render, output, typed=typed, shown=shown, plot=plot)


def rank_files(ranks, output: str | None, trace: str | None) -> tuple[str | None, str | None]:
    """A rank's own --output and --trace: ``{rank}`` filled in (a trace always gets its rank);
    without ``{rank}``, only rank 0 writes the report, the merged one."""
    from .ranks import rank_path

    if trace:
        trace = rank_path(trace, ranks.rank)
    if output and "{rank}" in output:
        output = rank_path(output, ranks.rank)
    elif ranks.rank != 0:
        output = None
    return output, trace


class Ending:
    """The end of a single process's check: ``finish(report)`` writes the report (and the
    --plot picture) and returns the exit code."""

    on_destroy = None  # a rank's report at destroy_process_group(): RankEnding's
    early_code: int | None = None  # the exit code of a report already final (RankEnding)

    def __init__(self, fmt: ReportFormat, render: RenderOptions, output: str | None, *,
                 typed: str | None = None, shown: str | None = None, plot: str | None = None):
        self.fmt = fmt
        self.render = render
        self.output = output  # the file this process writes; None: stdout
        self.typed = typed  # --output as given, absolute ("{rank}" kept)
        self.shown = shown  # --output as typed, for messages
        self.plot = plot

    def run(self, options):
        """``run_check`` with this ending's callbacks, under the progress line."""
        from .session import run_check

        progress = self.progress_line(options)
        with progress, self._stopped_from_outside():
            # a line that is not drawn (no terminal) never will be: not called every step
            on_step = progress.update if progress.enabled else None
            return run_check(options, on_step=on_step, on_hang=self.on_hang,
                             checkpoint=self.checkpoint, on_destroy=self.on_destroy)

    def progress_line(self, options, suffix: str = "", enabled: bool | None = None):
        from ..report.progress import Progress

        label = options.target if options.module else os.path.basename(options.target)
        if self.render.quiet:  # --quiet: no progress line either
            enabled = False
        return Progress(f"{label}{suffix}", options.steps or None, enabled=enabled)

    def _stopped_from_outside(self):
        return contextlib.nullcontext()

    @property
    def checkpoint(self):
        """``run_check``'s ``checkpoint``: provisional reports go to an --output file only."""
        return self._write_provisional if self.output else None

    def _write_provisional(self, report) -> None:  # replaced by the final report
        write_report(report, self.fmt, self.output, self.render)

    def finish(self, report, wait_s: float | None = None) -> int:
        emit_report(report, self.fmt, self.output, self.render, self.shown)
        if self.plot:
            _draw(report, self.plot)
        return report.exit_code()

    def end_early(self) -> int:
        """After the run, when the report was final before it ended (``early_code``): the
        process let go of unwaited, with that report's exit code."""
        end_unwaited()
        return self.early_code

    def on_hang(self, report) -> None:
        """From the watchdog: the script is stuck; report, then end the process."""
        try:
            code = self.finish(report, wait_s=30.0)
        except BaseException:
            code = 2
        hard_exit(code)


def _draw(report, path: str) -> None:
    """The gradient-flow picture; its failure is a line on stderr, never the check's."""
    from ..report.plot import plot

    try:
        plot(report, path)
        say(f"graddoctor: drew {path}")
    except Exception as exc:
        say(f"graddoctor: could not draw {path}: {type(exc).__name__}: {exc}")


class RankEnding(Ending):
    """One rank's end (module docstring): ranks other than 0 hand their report to rank 0 and
    exit 0; rank 0 gets the run's report, merged from every rank's, writes it, and exits by
    it. Built at the rank's start, which it registers."""

    def __init__(self, fmt: ReportFormat, render: RenderOptions, output: str | None, *,
                 ranks, options, typed: str | None = None, shown: str | None = None):
        from .ranks import Exchange
        from .teardown import defer_teardown

        super().__init__(fmt, render, output, typed=typed, shown=shown)
        self.ranks = ranks
        self.options = options
        self.exchange = Exchange(ranks)
        self.exchange.register()  # where this rank runs, for rank 0 to see it gone
        defer_teardown()  # the script's objects outlive the rank's report (end_unwaited)

    def progress_line(self, options, suffix: str = "", enabled: bool | None = None):
        # ranks share one terminal: only rank 0 draws the status line
        return super().progress_line(options, f" · rank {self.ranks.rank}",
                                 False if self.ranks.rank != 0 else None)

    def _stopped_from_outside(self):
        """A rank stopped by its launcher (SIGTERM) reports what it had, as rank 0 merges it."""
        from .ranks import reporting_on_sigterm

        return reporting_on_sigterm()

    @property
    def per_rank(self) -> bool:
        """-o 'r.{rank}.json': every rank writes its own report too."""
        return bool(self.typed) and "{rank}" in self.typed

    def finish(self, report, wait_s: float | None = None, early: bool = False) -> int:
        from .ranks import rank_report

        mine = rank_report(report, self.ranks)
        if self.per_rank:
            write_report(mine, self.fmt, self.output, self.render)
        code = self._hand_over(mine) if self.ranks.rank != 0 else self._gather(report, wait_s)
        if not early:  # (at destroy_process_group the script goes on: its end is not near)
            end_unwaited()
        return code

    def _hand_over(self, mine) -> int:
        """A rank other than 0: its report to rank 0, else to a file of its own or stderr."""
        from ..report.json_format import render as render_json
        from .ranks import rank_path

        if not self.exchange.send(render_json(mine)) and not self.per_rank:
            fallback = rank_path(self.typed, self.ranks.rank) if self.typed else None
            if fallback:
                write_report(mine, self.fmt, fallback, self.render)
            say(f"graddoctor: {self.ranks.label}: could not hand the report to rank 0 "
                f"({self.exchange.error}); " + (f"wrote {fallback}" if fallback else
                                                "its report follows on stderr"))
            if not fallback:
                say(FORMATS["text"].render(mine, RenderOptions()))
        return 0  # never a failure code: the launcher would kill the ranks still reporting

    def _gather(self, report, wait_s: float | None) -> int:
        """Rank 0: every rank's report merged with its own, written; the verdict posted."""
        from ..report.text import verdict
        from .ranks import gather, rank_path

        files = None
        if self.ranks.store is None and self.typed and self.fmt.name == "json":
            files = {r: rank_path(self.typed, r) for r in range(self.ranks.world_size)}
        merged = gather(self.exchange, report, self.options, wait_s, files)
        if self.per_rank:
            say(f"graddoctor: wrote {self.output} (and one per rank): {verdict(merged).plain}")
        else:
            emit_report(merged, self.fmt, self.output, self.render, self.shown)
        code = merged.exit_code()
        self.exchange.post_verdict(code)
        return code

    def on_destroy(self, report, destroy) -> None:
        """A rank's report at the script's destroy_process_group(), before its teardown
        (run/interim.py ``EarlyReport``): final, whatever that teardown does."""
        from .stdio import real_stdout

        if self.ranks.rank == 0:
            destroy()  # the group goes first: another rank's destroy may wait for rank 0's
        with real_stdout():  # the script's stdout goes to stderr while it runs
            self.early_code = self.finish(report, early=True)


def end_unwaited() -> None:
    """A rank has handed over its report (rank 0: written the run's): the script's objects
    are let go of now (run/session.py held them), and if that teardown or the interpreter's
    hangs (a process group's destructor joining a gloo thread that waits for the GIL the main
    thread holds), a timer in C, which needs no GIL, ends the process: nobody waits for it.
    Its exit code (1) is not the run's: rank 0 posted the verdict, which
    ``--nproc-per-node``'s launcher returns."""
    import faulthandler

    from .ranks import teardown_grace
    from .teardown import release_deferred

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
    if threading.current_thread() is threading.main_thread():  # not from the watchdog
        release_deferred()


def hard_exit(code: int) -> None:
    """End the process now: the script left a thread or a call that would keep it alive."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
