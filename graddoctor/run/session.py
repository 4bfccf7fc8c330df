"""A run's one owner: the ``Session``. Every front door enters one (``graddoctor check`` and
``check_script`` through ``run_check``, ``watch()`` and what is built on it: the notebook
magic and the pytest plugin; a spawned worker, run/workers.py; a rank, run/ranks.py). It starts
the recording, runs the target (run/target.py) or wraps the caller's block, ends it, and builds
the ``Report`` once (run/build.py), with the workers' parts merged in.

target -> instrument -> trace -> rules -> report, in one direction; the front doors only
resolve options, enter a session and render what it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from typing import Callable

from ..errors import ScriptError, WatchError
from .. import events as ev
from ..options import CheckOptions
from ..report.model import Report, RunInfo
from ..status import ReplayTimeout, decide_status
from .build import build_report
from .device import device_policy
from .ending import RunOutcome, describe_ending
from .interim import Checkpoints, EarlyReport, snapshot
from .stdio import stdout_to_stderr
from .target import run_target
from .teardown import let_go
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
                 announce: bool = True, first_notes: tuple[str, ...] = ()):
        self.options = options
        self.first_notes = first_notes  # the report's first notes (why this run was made)
        self.claim = claim
        self.announce = announce
        self.rec = None
        self.instrumentation = None
        self._stack: contextlib.ExitStack | None = None  # what begin() entered
        self._lock: contextlib.ExitStack | None = None  # the one-check lock, if claimed
        self._started = 0.0
        self.emulation = None  # the CudaEmulation of an --emulate-cuda run

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
            if self.options.emulate_cuda:  # under everything else: the script's GPU path
                from .emulate_cuda import CudaEmulation

                if self.options.device != "auto":
                    raise ScriptError(f"--emulate-cuda runs the script's GPU path on the CPU: it "
                                      f"cannot be combined with --device {self.options.device}")

                self.emulation = stack.enter_context(CudaEmulation())
            for context in around:
                stack.enter_context(context(self.rec))
            self.instrumentation = stack.enter_context(
                Instrumentation(self.rec, self.options.epoch_batches,
                                grad_flow=self.options.grad_flow))
            if self.emulation is not None:
                self.emulation.watch_originals(self.instrumentation.patcher.originals())
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
        self.begin(around=(lambda rec: device_policy(options.device),
                           lambda rec: stdout_to_stderr(options.redirect_stdout),
                           workers.watching))
        from ..instrument.topics import COUNTED_STEP, STEPPED

        rec, instrumentation = self.rec, self.instrumentation
        if on_step is not None:
            rec.subscribe(COUNTED_STEP, on_step)
        provisional = Checkpoints(self, checkpoint, self._started)
        if checkpoint is not None:  # without one it does nothing: not asked after every step
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
            on_hang(build_report(options, rec, snapshot(rec, variables), ending,
                                 duration=time.perf_counter() - self._started))

        destroy = EarlyReport(self, on_destroy) if on_destroy is not None else None
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
            _emulation_notes(self.emulation, outcome, rec.finder)
            outcome.notes[:0] = self.first_notes
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
                held = [outcome.namespace, outcome.ended_by]
                outcome.namespace = outcome.ended_by = None
                let_go(held)
            return report
        finally:
            lock.close()


def _emulation_notes(emulation, outcome: RunOutcome, finder) -> None:
    """``--emulate-cuda``: what the fake GPU answered, and a failure the CPU cannot emulate
    named as such; without it, a script that failed for want of a GPU gets a hint."""
    from .emulate_cuda import needs_cuda_hint

    try:
        if emulation is None:
            hint = needs_cuda_hint(outcome.error)
            if hint:
                outcome.notes.append(hint)
            return
        outcome.notes[:0] = emulation.notes()
        exc = outcome.ended_by
        if outcome.error and isinstance(exc, BaseException):
            why = emulation.explain_failure(exc, finder)
            if why:
                outcome.error = {**outcome.error, "message": f"{why} ({outcome.error['message']})"}
    except Exception as error:  # graddoctor's own failure: a note, never the run's
        outcome.notes.append(f"graddoctor could not describe the CUDA emulation: {error!r}")


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
    ``CHECKPOINT_EVERY_S`` and while they have taken less than ``CHECKPOINT_CPU_SHARE`` of the
    process's CPU time without a step budget, and while the writes have taken less than
    ``CHECKPOINT_SHARE`` of the time since the start plus ``CHECKPOINT_ALLOWANCE_S``): what is
    left if the process is killed before the final report.
    ``on_destroy(report, destroy)``: a rank's report when the script calls
    ``destroy_process_group()`` (``EarlyReport``, run/interim.py), before its teardown.
    """
    def check(opts: CheckOptions, first_notes: tuple[str, ...] = ()) -> Report:
        return Session(opts, claim=f"graddoctor check {opts.target}", first_notes=first_notes).check(
            on_step, on_hang=on_hang, checkpoint=checkpoint, on_destroy=on_destroy)

    had_group = _default_group_exists()
    report = check(options)
    why = _needs_emulated_gpu(options, report)
    if why is None:
        return report
    notes = (why,) + _undo_first_run(had_group)
    return check(dataclasses.replace(options, emulate_cuda=True), first_notes=notes)


def _default_group_exists() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def _undo_first_run(had_group: bool) -> tuple[str, ...]:
    """Undo what the first run left in the process that the second would trip on: a default
    process group it initialised (a one-process `init_process_group` at the script's top, run
    again, raises "trying to initialize the default process group twice"). A note if that
    fails: graddoctor's own failure, never the run's."""
    if had_group or not _default_group_exists():
        return ()
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
        return ()
    except Exception as error:
        return (f"graddoctor could not destroy the process group the first run left: {error!r}",)


def _needs_emulated_gpu(options: CheckOptions, report: Report) -> str | None:
    """A note when the script stopped for want of a GPU before it trained (no backward, no
    step) on a machine without one, in a single process with ``--device auto``: run again on
    an emulated GPU (its GPU path, tensors on the CPU) rather than report nothing. The first
    run reached no training code, so no finding is lost; what it printed was printed."""
    from .emulate_cuda import needs_cuda_hint

    try:
        import os

        import torch

        run = report.run
        if (options.emulate_cuda or options.device != "auto" or "WORLD_SIZE" in os.environ or torch.cuda.is_available()
                or run.steps or run.backward_calls or not run.error
                or needs_cuda_hint(run.error) is None):
            return None
        where = (run.error.get("location") or {})
        at = f" at {where.get('path')}:{where.get('line')}" if where.get("path") else ""
        message = str(run.error.get("message") or "").strip().splitlines()
        said = f" ({run.error.get('type', 'error')}: {message[0][:120]})" if message else ""
        return (f"the script stopped{at} for want of a GPU{said}, before any backward: graddoctor "
                f"ran it again with its GPU path emulated on this CPU, as `--emulate-cuda` does "
                f"(`--device cpu` checks the CPU path instead; docs/emulate-cuda.md)")
    except Exception:  # graddoctor's own failure: the first report stands
        return None

