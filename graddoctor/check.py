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
from .rules.notes import gradient_apis, run_notes
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
    if changes.get("trace_path"):  # where the check starts, whatever directory the script goes to
        changes["trace_path"] = os.path.abspath(changes["trace_path"])
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

    if status == "completed" and rec.steps == 0 and rec.backward_calls == 0 \
            and not gradient_apis(trace):  # torch.func / autograd.grad: a note says so
        status = "no-training-loop"
    trace = Trace(trace.events)  # the run's trace is left as recorded; this one gets the end
    trace.put(events.run_end(status=status, steps=rec.steps))
    analysis = Analysis(trace)  # built once: every rule, note and view reads it
    rules = selected_rules(options.select, options.ignore)
    findings, rule_errors = analyze(analysis, rules)
    base_dir = rec.finder.base_dir  # where the check started: relative paths are relative to it
    findings = apply_suppressions(findings, base_dir)  # `# graddoctor: ignore[...]` on the line
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
    checksums = [{"opt": e["opt"], "step": e["step"], "value": e["value"],
                  "path": e.loc.path if e.loc else None, "line": e.loc.line if e.loc else None}
                 for e in analysis.of_kind("replica_checksum")]
    run = RunInfo(
        checksums=checksums or None,
        script=options.target, argv=list(options.args), status=status, steps=rec.steps,
        backward_calls=rec.backward_calls, device=device, torch_version=torch.__version__,
        duration_s=round(duration, 3), error=error, notes=notes,
        step_budget=options.steps or None, config=options.config_path,
        rules=[r.code for r in rules] if options.select or options.ignore else None,
    )
    return Report(run=run, findings=findings, internal_errors=internal, analysis=analysis,
                  fail_on=options.fail_on, allow_incomplete=options.allow_incomplete,
                  base_dir=base_dir)


def _stopped_elsewhere(rec, outcome) -> None:
    """The stop was raised in threads of the script and its main thread then ended normally
    (it joined them, or swallowed the stop): the replay was still cut, not completed."""
    others = len(rec.stopped_threads - {rec.script_thread})
    if rec.stop_raised and outcome.status == "completed":
        outcome.status = rec.stop_raised
    if others:
        outcome.notes.append(f"the script trained in threads: graddoctor ended the replay in "
                             f"{others} thread{'s' if others != 1 else ''} other than the main "
                             f"one at their next backward or step")


CHECKPOINT_EVERY_S = 2.0  # without a step budget, provisional reports at most this often
# Writing a provisional report analyses the trace so far: its cost grows with the run (less so
# once the recorder folds repeated turns, instrument/fold.py). So the writes may take at most
# this share of the wall time since the start, beyond a first allowance that lets short runs
# write after every step; a write skipped by it is made at a later step.
CHECKPOINT_SHARE = 0.1
CHECKPOINT_ALLOWANCE_S = 2.0


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
    ``CHECKPOINT_EVERY_S`` without a step budget, and while the writes have taken less than
    ``CHECKPOINT_SHARE`` of the time since the start plus ``CHECKPOINT_ALLOWANCE_S``): what is
    left if the process is killed before the final report.
    """
    options = validated(options)
    with exclusive(f"graddoctor check {options.target}"):
        return _run_check(options, on_step, on_hang, checkpoint)


def _run_check(options, on_step, on_hang, checkpoint) -> Report:
    from .instrument import Instrumentation
    from .instrument.graphkeep import release_after_check

    rec = start_recorder(options)
    finder = rec.finder
    if on_step is not None:
        rec.on_step.append(on_step)
    started = time.perf_counter()
    last_checkpoint = [-math.inf]
    spent_writing = [0.0]  # seconds spent on provisional reports so far

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
        if not force:
            if not rec.step_budget and now - last_checkpoint[0] < CHECKPOINT_EVERY_S:
                return  # unlimited replay: throttled; with a step budget: after every step
            if spent_writing[0] > CHECKPOINT_ALLOWANCE_S + CHECKPOINT_SHARE * (now - started):
                return  # and never more than a bounded share of the run's time
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
        finally:
            spent_writing[0] += time.perf_counter() - now

    from .children import Children, merge_children

    children = Children(options)  # multiprocessing workers: instrumented by a start-up hook
    with _device_policy(options.device), _stdout_to_stderr(options.redirect_stdout), \
            children.watching(rec):
        with Instrumentation(rec, options.epoch_batches) as instrumentation:
            rec.subscribe("stepped", provisional)
            outcome = run_target(options.target, list(options.args), module=options.module,
                                 timeout=options.timeout, finder=finder, on_hang=hang,
                                 on_start=lambda: provisional(force=True),
                                 last_resort=on_hang is not None,
                                 on_fork_child=instrumentation.detach_in_child)
            instrumentation.script_globals = outcome.namespace
    _stopped_elsewhere(rec, outcome)
    if len(instrumentation.step_threads) > 1:
        outcome.notes.append(
            f"optimizers stepped in {len(instrumentation.step_threads)} threads: each thread's "
            f"backward, zero_grad and step calls are followed as its own loop (the update "
            f"timeline shows them interleaved, in the order they ran)")
    report = build_report(options, rec, rec.trace, status=outcome.status,
                          error=outcome.error, notes=outcome.notes, duration=time.perf_counter() - started)
    # the script's globals are let go of here, so that deep graphs it left are freed safely
    outcome.namespace = instrumentation.script_globals = None
    release_after_check()
    return merge_children(report, children)
