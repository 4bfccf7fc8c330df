"""The library entry point: ``run_check(options) -> Report``.

runner -> instrument -> trace -> rules -> report, in one direction. The CLI is a thin layer
over this; tests call it in-process too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from typing import Callable

from . import events
from .analyze import analyze, selected_rules
from .options import CheckOptions
from .report.model import Report, RunInfo
from .runner import ScriptError, run_target
from .suppress import apply_suppressions
from .trace import Trace

__all__ = ["run_check", "ScriptError", "CheckOptions"]

DEVICES = ("auto", "cpu", "cuda")


def validated(options: CheckOptions) -> CheckOptions:
    """The options with ``timeout`` normalised (0 and infinity mean no limit); ScriptError
    names the first bad value."""
    steps = options.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ScriptError(f"--steps must be a whole number >= 0 (0 = run to the end), not {steps!r}")
    batches = options.epoch_batches
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
        raise ScriptError(f"--epoch-batches must be a whole number >= 0 (0 = the real length), "
                          f"not {batches!r}")
    timeout = options.timeout
    if timeout is not None:
        try:
            seconds = float(timeout)
        except (TypeError, ValueError):
            seconds = math.nan
        if math.isnan(seconds) or seconds < 0:
            raise ScriptError(f"--timeout must be a number of seconds >= 0 (0 = no limit), "
                              f"not {timeout!r}")
        timeout = None if seconds == 0 or math.isinf(seconds) else seconds
    if options.device not in DEVICES:
        raise ScriptError(f"--device must be one of {', '.join(DEVICES)}, not {options.device!r}")
    return dataclasses.replace(options, timeout=timeout)


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


def _epoch_notes(trace: Trace, rec) -> list[str]:
    """Say when DataLoader epochs were replayed shorter than they are (``--epoch-batches``)."""
    short = [e for e in trace.of_kind("epoch_start")
             if e.get("real_len") is not None and e.get("replay_len") is not None
             and e["replay_len"] < e["real_len"]]
    if not short:
        return []
    first = short[0]
    notes = [f"DataLoader epochs were replayed with {first['replay_len']} of their {first['real_len']} "
             f"batches (--epoch-batches; 0 replays full epochs)"]
    if rec.steps == 0 and rec.backward_calls:
        notes.append("no optimizer step happened within those short epochs: if you accumulate over "
                     f"more than {first['replay_len']} batches, raise --epoch-batches")
    return notes


def _compile_notes(trace: Trace) -> list[str]:
    calls = trace.of_kind("compile")
    if not calls:
        return []
    where = ", ".join(sorted({str(e.loc) for e in calls if e.loc})) or "a library"
    note = (f"torch.compile was used ({where}): graddoctor sees zero_grad, backward and optimizer "
            f"steps at the graph breaks torch makes there; calls traced into a compiled graph "
            f"are not seen")
    if any(e.get("fullgraph") for e in calls):
        note += "; with fullgraph=True a graph that contains them cannot be checked"
    return [note]


def _report(options: CheckOptions, rec, trace: Trace, *, status: str, error: dict | None,
            notes: list[str], duration: float) -> Report:
    import torch

    if status == "completed" and rec.steps == 0 and rec.backward_calls == 0:
        status = "no-training-loop"
    trace.add("run_end", None, status=status, steps=rec.steps)
    findings, rule_errors = analyze(trace, selected_rules(options.select, options.ignore))
    findings = apply_suppressions(findings)  # `# graddoctor: ignore[...]` on the reported line
    internal = [{"where": e["where"], "error": e["error"]} for e in trace.of_kind("internal_error")]
    internal += rule_errors
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
        duration_s=round(duration, 3), error=error,
        notes=[*notes, *_epoch_notes(trace, rec), *_compile_notes(trace)],
        step_budget=options.steps or None, config=options.config_path,
    )
    return Report(run=run, findings=findings, internal_errors=internal, trace=trace)


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
    import torch

    from .instrument import Instrumentation, Recorder
    from .location import LocationFinder

    finder = LocationFinder()
    rec = Recorder(step_budget=options.steps or None, finder=finder)
    if on_step is not None:
        rec.on_step.append(on_step)
    rec.emit(events.run_start(script=options.target, argv=list(options.args),
                              device=options.device, torch_version=torch.__version__))
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
        on_hang(_report(options, rec, _snapshot(rec, main_globals()), status="timeout",
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
            checkpoint(_report(options, rec, _snapshot(rec),
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
    return _report(options, rec, rec.trace, status=outcome.status, error=outcome.error,
                   notes=outcome.notes, duration=time.perf_counter() - started)
