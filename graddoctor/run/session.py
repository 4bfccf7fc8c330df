"""A run's one owner: the ``Session``. Every front door enters one (``graddoctor check`` and
``check_script`` through ``run_check``, ``watch()`` and what is built on it: the notebook
magic and the pytest plugin; a spawned worker, run/workers.py; a rank, run/ranks.py). It starts
the recording, runs the target (or wraps the caller's block), ends it, decides the status
(``status.decide_status``), merges the workers' parts and builds the ``Report`` once.

target -> instrument -> trace -> rules -> report, in one direction; the front doors only
resolve options, enter a session and render what it returns.
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

from ..analysis import Analysis
from ..rules import ALL_RULES
from ..rules.engine import analyze, selected_rules
from ..errors import ScriptError, WatchError
from .. import events as ev
from ..instrument.patcher import Patcher
from ..instrument.topics import COUNTED_STEP, STEPPED
from ..options import OPTIONS, CheckOptions
from ..report.merge import Part, merge
from ..report.model import Report, RunInfo
from ..rules.notes import gradient_apis, run_notes
from ..status import ReplayTimeout, RunStatus, Unfinished, decide_status
from ..suppress import apply_suppressions
from ..trace import Trace
from .target import RunOutcome, describe_ending, run_target
from .workers import Workers

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


def start_recorder(options: CheckOptions, announce: bool = True):
    """The recorder of one run (script or watched block), its ``run_start`` emitted when
    ``announce`` (a spawned worker's trace has none)."""
    import torch

    from ..instrument import Recorder
    from ..location import LocationFinder

    # the step budget may wait for a rarely stepped optimizer for half the time limit
    hold_s = options.timeout / 2 if options.timeout else None
    rec = Recorder(step_budget=options.steps or None, finder=LocationFinder(), hold_s=hold_s)
    if announce:
        rec.emit(ev.run_start(script=options.target, argv=list(options.args),
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
    patches = Patcher()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    patches.patch(torch.cuda, "is_available", lambda: False)
    try:
        yield
    finally:
        patches.undo()
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
    _redirected.append(saved_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _redirected.pop()
        if saved_fd is not None:
            with contextlib.suppress(Exception):
                sys.__stdout__.flush()  # what the script wrote to sys.__stdout__ goes to stderr
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


_redirected: list[int | None] = []  # while the script's stdout goes to stderr: the real one's fd


@contextlib.contextmanager
def real_stdout():
    """The real stdout for the block, while the script's goes to stderr: for a report written
    while the script still runs (a rank's, at ``destroy_process_group()``)."""
    if not _redirected:
        yield
        return
    saved_fd = _redirected[-1]
    script_fd = None
    try:
        sys.stdout.flush()
        sys.__stdout__.flush()
        if saved_fd is not None:
            script_fd = os.dup(1)
            os.dup2(saved_fd, 1)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with contextlib.redirect_stdout(sys.__stdout__):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.__stdout__.flush()
        if script_fd is not None:
            os.dup2(script_fd, 1)
            os.close(script_fd)


def _device_of(rec) -> str:
    for pid in rec.tracked_pids():
        t = rec.tensor(pid)
        if t is not None:
            return t.device.type
    return "cpu"


def _unknown_ignores(options: CheckOptions, findings, base_dir: str | None) -> list[str]:
    """A note per ``# graddoctor: ignore[name]`` whose name is no rule (a typo would silently
    suppress nothing), in the script and the files findings point at."""
    from ..notebook import describe
    from ..rules.engine import unknown_selectors
    from ..suppress import Suppressions

    paths = [f.location.path for f in findings if f.location is not None]
    if not options.module and os.path.isfile(options.target):
        paths.insert(0, options.target)
    table, notes, seen = Suppressions(base_dir), [], set()
    for path in paths:
        full = os.path.realpath(path if os.path.isabs(path) else
                                os.path.join(base_dir or os.getcwd(), path))
        if full in seen:
            continue
        seen.add(full)
        for line, directives in sorted(table.directives(path).items()):
            unknown = unknown_selectors([n for d in directives if d is not None for n in d])
            if unknown:
                notes.append(f"{describe(path, line)}: `# graddoctor: ignore[...]` names no rule: "
                             f"{', '.join(unknown)} (it suppresses nothing; see `graddoctor "
                             f"rules`)")
    return notes


def build_report(options: CheckOptions, rec, trace: Trace, outcome: RunOutcome, *,
                 duration: float, parts: list[Part] = (), world_size: int | None = None,
                 end_notes: list[str] = ()) -> Report:
    """The run's one ``Report``: its status decided (``decide_status``), the rules run over its
    trace, then, when other processes (``parts``) trained, their reports merged in."""
    import torch

    trained = bool(rec.progress.steps or rec.progress.backward_calls or gradient_apis(trace))
    status = decide_status(outcome.ended_by, stop_raised=rec.progress.stop_raised, trained=trained)
    trace = Trace(trace.events)  # the run's trace is left as recorded; this one gets the end
    trace.put(ev.run_end(status=status.value, steps=rec.progress.steps))
    base_dir = rec.finder.base_dir  # where the check started: relative paths are relative to it
    analysis = Analysis(trace, base_dir)  # built once: every rule, note and view reads it
    rules = selected_rules(options.select, options.ignore)
    findings, rule_errors = analyze(analysis, rules, base_dir)
    findings = apply_suppressions(findings, base_dir)  # `# graddoctor: ignore[...]` on the line
    try:
        end_notes = [*end_notes, *_unknown_ignores(options, findings, base_dir)]
    except Exception as exc:
        rec.internal_error("reading suppression comments", exc)
    internal = [{"where": e["where"], "error": e["error"]} for e in analysis.of_kind("internal_error")]
    internal += rule_errors
    notes = list(outcome.notes)
    try:
        notes += run_notes(analysis)
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
        script=options.target, argv=list(options.args), status=status, steps=rec.progress.steps,
        updates=rec.progress.updates,
        backward_calls=rec.progress.backward_calls, device=device, torch_version=torch.__version__,
        duration_s=round(duration, 3), error=outcome.error,
        notes=notes if parts else [*notes, *end_notes],
        step_budget=options.steps or None, config=options.config_path,
        rules_skipped=[r.code for r in ALL_RULES if r not in rules],
    )
    own = Report(run=run, findings=findings, internal_errors=internal, analysis=analysis,
                 fail_on=options.fail_on, allow_incomplete=options.allow_incomplete,
                 base_dir=base_dir)
    if not parts:
        return own
    # the update timeline of a parent that trained nothing would hide the workers' training
    main = Part(own, None, "main process", os.getpid())
    return merge([main, *parts], world_size=world_size, notes=end_notes, fail_on=options.fail_on,
                 allow_incomplete=options.allow_incomplete,
                 views=status is not RunStatus.NO_TRAINING_LOOP, rules=rules)


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
    from ..instrument.names import emit_param_events, name_parameters

    trace = rec.snapshot()
    try:
        if variables is not None:
            name_parameters(rec, variables)
        emit_param_events(rec, into=trace)
    except Exception as exc:
        trace.put(ev.internal_error(where="naming parameters", error=repr(exc)))
    return trace


class Session:
    """One instrumented run, from its start to its one ``Report`` (module docstring).

    ``check()`` runs a script through its whole life (``run_check``). ``begin()`` and
    ``end(exc)`` wrap a block of the caller's own code instead (``watch()``, a spawned
    worker's life): ``end`` gets the exception that ended the block, or None. Both end the
    same way (``_close``): the instrumentation removed, the status decided, the report built.

    ``claim``: what holds the process's one-check lock for the whole session (None: no lock,
    a spawned worker's interpreter is its own); ``announce``: a ``run_start`` event (a
    worker's trace has none).
    """

    def __init__(self, options: CheckOptions, *, claim: str | None = None,
                 announce: bool = True):
        self.options = options
        self.claim = claim
        self.announce = announce
        self.rec = None
        self.instrumentation = None
        self._stack: contextlib.ExitStack | None = None  # what begin() entered
        self._lock: contextlib.ExitStack | None = None  # the one-check lock, if claimed
        self._started = 0.0

    @property
    def started(self) -> float:
        """When the session began (``time.perf_counter()``)."""
        return self._started

    def begin(self, variables: Callable[[object], dict] | None = None, *,
              around: tuple[Callable[[object], contextlib.AbstractContextManager], ...] = ()
              ) -> "Session":
        """Start recording. ``variables(finder)``: the caller's variables, which hold the
        optimizers made before the block (registered here); ``around``: context managers
        (made from the recorder) the instrumentation runs inside of."""
        from ..instrument import Instrumentation

        lock, stack = contextlib.ExitStack(), contextlib.ExitStack()
        if self.claim is not None:
            lock.enter_context(exclusive(self.claim))
        try:
            self._started = time.perf_counter()
            self.rec = start_recorder(self.options, self.announce)
            for context in around:
                stack.enter_context(context(self.rec))
            self.instrumentation = stack.enter_context(
                Instrumentation(self.rec, self.options.epoch_batches,
                                grad_flow=self.options.grad_flow))
            if variables is not None:
                try:
                    self.instrumentation.optimizers.adopt_existing(
                        self.rec.here(1), variables(self.rec.finder).values())
                except Exception as error:
                    self.rec.internal_error("optimizers made before the watch", error)
        except BaseException:
            stack.close()
            lock.close()
            raise
        self._stack, self._lock = stack, lock
        return self

    def end(self, exc: BaseException | None = None,
            variables: Callable[[object], dict] | None = None) -> Report:
        """End the block (``exc``: the exception that ended it; ``variables(finder)``: the
        caller's variables, which name the parameters) and build its report; graddoctor's own
        failure here never raises: the report says so."""
        outcome = describe_ending(exc, self.rec.finder) if exc is not None else RunOutcome()
        try:
            if variables is not None:
                outcome.namespace = variables(self.rec.finder)
        except Exception as error:
            self.rec.internal_error("naming parameters", error)
        try:
            return self._close(outcome)
        except Exception as error:  # graddoctor's own failure must not replace the user's
            rec = self.rec
            run = RunInfo(script=self.options.target, argv=[], status=decide_status(exc),
                          steps=rec.progress.steps, backward_calls=rec.progress.backward_calls,
                          error=outcome.error, notes=outcome.notes)
            return Report(run=run, findings=[], internal_errors=[
                {"where": "building the report", "error": f"{type(error).__name__}: {error}"}],
                fail_on=self.options.fail_on, allow_incomplete=self.options.allow_incomplete)

    def discard(self) -> None:
        """End the session without a report (a worker that trained nothing, a script that
        cannot run)."""
        stack, lock = self._stack, self._lock
        self._stack = self._lock = None
        try:
            stack.close()
        finally:
            lock.close()

    def check(self, on_step: Callable[[int], None] | None = None, *,
              on_hang: Callable[[Report], None] | None = None,
              checkpoint: Callable[[Report], None] | None = None,
              on_destroy: Callable[[Report, Callable[[], None]], None] | None = None) -> Report:
        """Run the script (``run_check`` says what the callbacks get)."""
        options = self.options
        workers = Workers(options)  # multiprocessing workers: instrumented by a start-up hook
        self.begin(around=(lambda rec: _device_policy(options.device),
                           lambda rec: _stdout_to_stderr(options.redirect_stdout),
                           workers.watching))
        rec, instrumentation = self.rec, self.instrumentation
        if on_step is not None:
            rec.subscribe(COUNTED_STEP, on_step)
        provisional = _Checkpoints(self, checkpoint, self._started)
        rec.subscribe(STEPPED, provisional)

        def hang(where: dict | None) -> None:
            """From the watchdog: the report of a run that cannot be stopped."""
            if on_hang is None:
                return
            workers.discard()  # the process ends from here: no folder left behind
            main = sys.modules.get("__main__")
            variables = dict(vars(main)) if main is not None else {}
            ending = RunOutcome(ended_by=ReplayTimeout(), error={
                "type": "Timeout", "location": where, "message": (
                    f"time limit of {options.timeout:g} s reached and the script did not "
                    f"stop: it is stuck in a call that never returns to Python (or swallows "
                    f"every exception); graddoctor ended the process")})
            on_hang(build_report(options, rec, _snapshot(rec, variables), ending,
                                 duration=time.perf_counter() - self._started))

        destroy = _EarlyReport(self, on_destroy) if on_destroy is not None else None
        try:
            with destroy.watching() if destroy is not None else contextlib.nullcontext():
                outcome = run_target(options.target, list(options.args), module=options.module,
                                     timeout=options.timeout, finder=rec.finder, on_hang=hang,
                                     on_start=lambda: provisional(force=True),
                                     last_resort=on_hang is not None,
                                     on_fork_child=instrumentation.detach_in_child)
        except BaseException:  # the target cannot run (ScriptError)
            self.discard()
            raise
        return self._close(outcome, workers)

    def _close(self, outcome: RunOutcome, workers: Workers | None = None) -> Report:
        """The end every session shares: the instrumentation removed (naming the parameters
        from ``outcome.namespace``), the status decided and the report built once, with the
        parts of the workers a script spawned; the process's lock is held until then."""
        rec, instrumentation = self.rec, self.instrumentation
        stack, lock = self._stack, self._lock
        self._stack = self._lock = None
        try:
            instrumentation.namer.name_from(outcome.namespace)
            stack.close()  # never raises: the instrumentation records its own errors
            others = len(rec.progress.stopped_threads - {rec.script_thread})
            if others:
                outcome.notes.append(
                    f"the script trained in threads: graddoctor ended the replay in {others} "
                    f"thread{'s' if others != 1 else ''} other than the main one at their next "
                    f"backward or step")
            if len(instrumentation.namer.step_threads) > 1:
                outcome.notes.append(
                    f"optimizers stepped in {len(instrumentation.namer.step_threads)} threads: each "
                    f"thread's backward, zero_grad and step calls are followed as its own loop "
                    f"(the update timeline shows them interleaved, in the order they ran)")
            parts, worker_notes = workers.reports() if workers is not None else ([], [])
            ranks = {p.rank for p in parts if p.rank is not None}
            report = build_report(self.options, rec, rec.trace, outcome,
                                  duration=time.perf_counter() - self._started, parts=parts,
                                  world_size=max(ranks) + 1 if ranks else 1,
                                  end_notes=worker_notes)
            if workers is not None:
                # the script's globals (and the exception's frames) are let go of here, so that
                # deep graphs it left are freed safely; a rank's, once its report is handed
                # over (their destructors can hang: a process group's)
                held = (outcome.namespace, outcome.ended_by)
                outcome.namespace = outcome.ended_by = None
                if _deferred is not None:
                    _deferred.append(held)
                else:
                    del held
                    release_deferred(True)
            return report
        finally:
            lock.close()


_deferred: list | None = None  # a rank's script objects, held until its report is handed over


def defer_teardown() -> None:
    """From a rank's front door: what the script left (its globals, the exception whose
    frames hold its locals: a DDP model, a process group) is let go of only at
    ``release_deferred()``, once the rank's report is handed over, so that their destructors
    (which can deadlock: a gloo thread waiting for the GIL) cannot hold the report back."""
    global _deferred
    _deferred = []


def release_deferred(now: bool = False) -> None:
    """Let go of what ``defer_teardown`` held, and free what graddoctor kept of the graphs."""
    global _deferred
    held, _deferred = _deferred, None
    if held is None and not now:
        return
    if held:
        held.clear()
    from ..instrument.graphkeep import release_after_check

    release_after_check()


class _EarlyReport:
    """A rank's report at the script's ``destroy_process_group()``: training is over there,
    and what follows (``main()`` returning frees the DDP model and the process group, whose
    destructors can deadlock on the GIL) must not hold the report back.
    ``on_destroy(report, destroy)`` gets the report as of that call, with its deferred values
    read, and the original ``destroy`` to call (once) when it wants the group gone."""

    def __init__(self, session: Session, on_destroy):
        self.session = session
        self.on_destroy = on_destroy
        self.done = False

    @contextlib.contextmanager
    def watching(self):
        import torch.distributed as dist

        patches = Patcher()
        early = self
        original = dist.destroy_process_group

        def destroy_process_group(group=None, *args, **kwargs):
            if group is not None or early.done or not early.session.rec.progress.steps:
                return original(group, *args, **kwargs)
            early.done = True
            called = []

            def destroy():
                if not called:
                    called.append(original(group, *args, **kwargs))

            try:
                early.on_destroy(early.report(sys._getframe(1)), destroy)
            except Exception as exc:  # graddoctor's own failure: the report at the end
                early.session.rec.internal_error("report at destroy_process_group", exc)
            destroy()
            return called[0] if called else None

        patches.patch(dist, "destroy_process_group", destroy_process_group)
        try:
            yield
        finally:
            patches.undo()

    def report(self, frame) -> Report:
        from ..instrument.recorder import resolved

        session = self.session
        rec = session.rec
        variables = {}
        main = sys.modules.get("__main__")
        if main is not None:
            variables.update(vars(main))
        try:
            variables.update(frame.f_locals)  # main()'s model and optimizer, by their names
        finally:
            del frame
        return build_report(session.options, rec, resolved(_snapshot(rec, variables)),
                            RunOutcome(), duration=time.perf_counter() - session.started)


class _Checkpoints:
    """The provisional reports of a script check (``run_check``'s ``checkpoint``)."""

    def __init__(self, session: Session, checkpoint, started: float):
        self.session = session
        self.checkpoint = checkpoint
        self.started = started
        self.last = -math.inf
        self.spent_writing = 0.0  # seconds spent on provisional reports so far

    def __call__(self, *_args, force: bool = False) -> None:
        now = time.perf_counter()
        if self.checkpoint is None:
            return
        rec = self.session.rec
        if not force:
            if not rec.progress.step_budget and now - self.last < CHECKPOINT_EVERY_S:
                return  # unlimited replay: throttled; with a step budget: after every step
            if self.spent_writing > CHECKPOINT_ALLOWANCE_S + CHECKPOINT_SHARE * (now - self.started):
                return  # and never more than a bounded share of the run's time
        self.last = now
        try:
            ending = RunOutcome(ended_by=Unfinished(), error={
                "type": "Unfinished", "location": None, "message": (
                    f"graddoctor did not finish: the process ended after {rec.progress.steps} optimizer "
                    f"steps (killed, out of memory, or stuck past the time limit in code that "
                    f"holds Python's lock); this report holds what was seen until then")})
            self.checkpoint(build_report(self.session.options, rec, _snapshot(rec), ending,
                                         duration=now - self.started))
        except Exception as exc:
            rec.internal_error("provisional report", exc)
        finally:
            self.spent_writing += time.perf_counter() - now


def run_check(options: CheckOptions, on_step: Callable[[int], None] | None = None, *,
              on_hang: Callable[[Report], None] | None = None,
              checkpoint: Callable[[Report], None] | None = None,
              on_destroy: Callable[[Report, Callable[[], None]], None] | None = None) -> Report:
    """Replay the user's script under instrumentation and judge the trace.

    Raises ``ScriptError`` only when the target cannot be run at all; everything the script
    does (crash, exit, hang) ends up in the report's ``run.status``. ``on_step(n)`` is called
    after each optimizer step with the updates so far, what the step budget counts (a progress
    display).

    ``on_hang(report)`` is called from a watchdog thread when the script is stuck past the time
    limit in a call that never returns to Python: the report holds what was seen so far. The
    CLI writes it and ends the process; without ``on_hang`` such a run cannot be ended.
    ``checkpoint(report)`` receives a provisional report (status ``crashed``: "graddoctor did
    not finish") when the script starts and after every optimizer step (at most every
    ``CHECKPOINT_EVERY_S`` without a step budget, and while the writes have taken less than
    ``CHECKPOINT_SHARE`` of the time since the start plus ``CHECKPOINT_ALLOWANCE_S``): what is
    left if the process is killed before the final report.
    ``on_destroy(report, destroy)``: a rank's report when the script calls
    ``destroy_process_group()`` (``_EarlyReport``), before its teardown.
    """
    options = validated(options)
    return Session(options, claim=f"graddoctor check {options.target}").check(
        on_step, on_hang=on_hang, checkpoint=checkpoint, on_destroy=on_destroy)
