"""The one instrumented path: ``run_check(options) -> Report`` for a script, and the pieces
``graddoctor.watch()`` (api.py) shares with it (``exclusive``, ``start_recorder``,
``build_report``).

runner -> instrument -> trace -> rules -> report, in one direction. The CLI and
``graddoctor.check_script`` are thin layers over this; tests call it in-process too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from typing import Callable

from . import events
from .analysis import Analysis
from .analysis.run_rules import analyze, selected_rules
from .errors import WatchError
from .options import OPTIONS, CheckOptions
from .report.model import Report, RunInfo
from .rules.notes import run_notes
from .runner import ScriptError, run_target
from .suppress import apply_suppressions
from .trace import Trace

__all__ = ["run_check", "ScriptError", "CheckOptions"]

_ACTIVE = threading.Lock()  # one instrumented run per process: it patches torch process-wide
_active_what: list[str] = []


@contextlib.contextmanager
def exclusive(what: str):
    """Hold the process's one instrumented run (a check or a ``watch()`` block) while the
    body runs; ``WatchError`` when another is active (nested, or from another thread)."""
    if not _ACTIVE.acquire(blocking=False):
        other = _active_what[0] if _active_what else "another check"
        raise WatchError(
            f"{what}: {other} is already active in this process. graddoctor instruments torch "
            f"process-wide, so checks cannot be nested or run at the same time from several "
            f"threads; end the first one (or run the second in another process)")
    _active_what[:] = [what]
    try:
        yield
    finally:
        _active_what.clear()
        _ACTIVE.release()


def start_recorder(options: CheckOptions):
    """The recorder of one run (script or watched block), its ``run_start`` emitted."""
    import torch

    from .instrument import Recorder
    from .location import LocationFinder

    rec = Recorder(step_budget=options.steps or None, finder=LocationFinder())
    rec.emit(events.run_start(script=options.target, argv=list(options.args),
                              device=options.device, torch_version=torch.__version__))
    return rec


def validated(options: CheckOptions) -> CheckOptions:
    """The options checked by the option table (options.py) and normalised: selectors as a
    flat tuple, ``timeout`` 0 or infinity as None (no limit). ScriptError names the first bad
    value."""
    changes = {}
    for option in OPTIONS.values():
        if option.field is None:  # the CLI's own (report format, output file)
            continue
        try:
            changes[option.field] = option.check(getattr(options, option.field), "library")
        except ValueError as exc:
            raise ScriptError(str(exc)) from None
    if changes["timeout"] == 0 or math.isinf(changes["timeout"] or 0):
        changes["timeout"] = None
    return dataclasses.replace(options, **changes)


@contextlib.contextmanager
def _device_policy(device: str):
    """``cpu`` hides CUDA from the script; ``cuda`` insists on it; ``auto`` leaves it be."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ScriptError("--device cuda: no CUDA device is available here")
    if device != "cpu":
        yield
        return
    saved_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    saved_available = torch.cuda.is_available
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = saved_available
        if saved_env is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved_env


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool):
    """While the script runs, everything it writes to stdout goes to stderr — at the file
    descriptor too, so that C code, subprocesses and spawned workers cannot corrupt a machine
    report on stdout."""
    if not enabled:
        yield
        return
    saved_fd = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):  # no real file descriptors (embedded, tests)
        if saved_fd is not None:
            os.close(saved_fd)
        saved_fd = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved_fd is not None:
            with contextlib.suppress(Exception):
                sys.__stdout__.flush()  # what the script wrote to sys.__stdout__ goes to stderr
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _device_of(rec) -> str:
    for pid in rec.tracked_pids():
        t = rec.tensor(pid)
        if t is not None:
            return t.device.type
    return "cpu"


def build_report(options: CheckOptions, rec, trace: Trace, *, status: str, error: dict | None,
                 notes: list[str], duration: float) -> Report:
    import torch

    if status == "completed" and rec.steps == 0 and rec.backward_calls == 0:
        status = "no-training-loop"
    trace = Trace(trace.events)  # the run's trace is left as recorded; this one gets the end
    trace.put(events.run_end(status=status, steps=rec.steps))
    analysis = Analysis(trace)  # built once: every rule, note and view reads it
    findings, rule_errors = analyze(analysis, selected_rules(options.select, options.ignore))
    findings = apply_suppressions(findings)  # `# graddoctor: ignore[...]` on the reported line
    internal = [{"where": e["where"], "error": e["error"]} for e in analysis.of_kind("internal_error")]
    internal += rule_errors
    try:
        notes = [*notes, *run_notes(analysis)]
    except Exception as exc:
        internal.append({"where": "run notes", "error": f"{type(exc).__name__}: {exc}"})
    if options.trace_path:
        try:
            with open(options.trace_path, "w", encoding="utf-8") as f:
                f.write(trace.dumps())
        except OSError as exc:
            internal.append({"where": "writing --trace", "error": f"{type(exc).__name__}: {exc}"})
    try:
        device = _device_of(rec)
    except Exception:
        device = "unknown"
    run = RunInfo(
        script=options.target, argv=list(options.args), status=status, steps=rec.steps,
        backward_calls=rec.backward_calls, device=device, torch_version=torch.__version__,
        duration_s=round(duration, 3), error=error, notes=notes,
        step_budget=options.steps or None, config=options.config_path,
    )
    return Report(run=run, findings=findings, internal_errors=internal, analysis=analysis)


CHECKPOINT_EVERY_S = 2.0  # without a step budget, provisional reports at most this often


def _snapshot(rec, variables: dict | None = None) -> Trace:
    """A copy of the trace so far, with the parameters' flags (and names: found from
    ``variables`` when given), for a report written while the script still runs or never
    returns. It shares no mutable object with the live trace: the recorded events are final,
    the aggregates still open are copied as they are now (``Recorder.snapshot``), and device
    values not read yet show as ``unread``."""
    from .instrument.names import emit_param_events, name_parameters

    trace = rec.snapshot()
    try:
        if variables is not None:
            name_parameters(rec, variables)
        emit_param_events(rec, into=trace)
    except Exception as exc:
        trace.put(events.internal_error(where="naming parameters", error=repr(exc)))
    return trace


def run_check(options: CheckOptions, on_step: Callable[[int], None] | None = None, *,
              on_hang: Callable[[Report], None] | None = None,
              checkpoint: Callable[[Report], None] | None = None) -> Report:
    """Replay the user's script under instrumentation and judge the trace.

    Raises ``ScriptError`` only when the target cannot be run at all; everything the script
    does (crash, exit, hang) ends up in the report's ``run.status``. ``on_step(n)`` is called
    after each optimizer step (a progress display).

    ``on_hang(report)`` is called from a watchdog thread when the script is stuck past the time
    limit in a call that never returns to Python: the report holds what was seen so far. The
    CLI writes it and ends the process; without ``on_hang`` such a run cannot be ended.
    ``checkpoint(report)`` receives a provisional report (status ``crashed``: "graddoctor did
    not finish") when the script starts and after every optimizer step (at most every
    ``CHECKPOINT_EVERY_S`` without a step budget): what is left if the process is killed
    before the final report.
    """
    options = validated(options)
    with exclusive(f"graddoctor check {options.target}"):
        return _run_check(options, on_step, on_hang, checkpoint)


def _run_check(options, on_step, on_hang, checkpoint) -> Report:
    from .instrument import Instrumentation

    rec = start_recorder(options)
    finder = rec.finder
    if on_step is not None:
        rec.on_step.append(on_step)
    started = time.perf_counter()
    last_checkpoint = [-math.inf]

    def main_globals() -> dict:
        main = sys.modules.get("__main__")
        return dict(vars(main)) if main is not None else {}

    def hang(where: dict | None) -> None:
        """From the watchdog: the report of a run that cannot be stopped."""
        if on_hang is None:
            return
        error = {"type": "Timeout", "location": where, "message": (
            f"time limit of {options.timeout:g} s reached and the script did not stop: it is stuck "
            f"in a call that never returns to Python (or swallows every exception); graddoctor "
            f"ended the process")}
        on_hang(build_report(options, rec, _snapshot(rec, main_globals()), status="timeout",
                        error=error, notes=[], duration=time.perf_counter() - started))

    def provisional(*_args, force: bool = False) -> None:
        now = time.perf_counter()
        if checkpoint is None:
            return
        if not force and not rec.step_budget and now - last_checkpoint[0] < CHECKPOINT_EVERY_S:
            return  # unlimited replay: throttled; with a step budget: after every step
        last_checkpoint[0] = now
        try:
            error = {"type": "Unfinished", "location": None, "message": (
                f"graddoctor did not finish: the process ended after {rec.steps} optimizer "
                f"steps (killed, out of memory, or stuck past the time limit in code that holds "
                f"Python's lock); this report holds what was seen until then")}
            checkpoint(build_report(options, rec, _snapshot(rec),
                               status="crashed", error=error, notes=[], duration=now - started))
        except Exception as exc:
            rec.internal_error("provisional report", exc)

    with _device_policy(options.device), _stdout_to_stderr(options.redirect_stdout):
        with Instrumentation(rec, options.epoch_batches) as instrumentation:
            instrumentation.optimizers.step_listeners.append(provisional)
            outcome = run_target(options.target, list(options.args), module=options.module,
                                 timeout=options.timeout, finder=finder, on_hang=hang,
                                 on_start=lambda: provisional(force=True),
                                 last_resort=on_hang is not None)
            instrumentation.script_globals = outcome.namespace
    return build_report(options, rec, rec.trace, status=outcome.status, error=outcome.error,
                   notes=outcome.notes, duration=time.perf_counter() - started)
