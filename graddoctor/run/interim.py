"""Reports written while the script still runs, from a snapshot of the trace (``snapshot``):
the provisional reports of a long check (``Checkpoints``) and a rank's report at its
``destroy_process_group()`` (``EarlyReport``). The final report replaces them."""

from __future__ import annotations

import contextlib
import math
import sys
import time

from .. import events as ev
from ..instrument.patcher import Patcher
from ..report.model import Report
from ..status import Unfinished
from ..trace import Trace
from .build import build_report
from .ending import RunOutcome

# without a step budget (a long run, ``--steps 0``), provisional reports at most this often:
# the file left by a killed run is at most this old, and a run of many short steps does
# not pay a write (tens of ms with a picture) every few hundred steps
CHECKPOINT_EVERY_S = 10.0
# Writing a provisional report analyses the trace so far: its cost grows with the run (less so
# once the recorder folds repeated turns, instrument/fold.py). So the writes may take at most
# this share of the wall time since the start, beyond a first allowance that lets short runs
# write after every step; a write skipped by it is made at a later step.
CHECKPOINT_SHARE = 0.1
CHECKPOINT_ALLOWANCE_S = 2.0
# Without a step budget, also at most this share of the process's CPU time since the start (the
# first write excepted): on a loaded machine a run takes several times its CPU time in wall time,
# and a schedule on wall time alone wrote several times as many reports for the same work
# (9 instead of 2 in a 20,000-step run at load 12, 65 ms of CPU each)
CHECKPOINT_CPU_SHARE = 0.01


def snapshot(rec, variables: dict | None = None) -> Trace:
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



class EarlyReport:
    """A rank's report at the script's ``destroy_process_group()``: training is over there,
    and what follows (``main()`` returning frees the DDP model and the process group, whose
    destructors can deadlock on the GIL) must not hold the report back.
    ``on_destroy(report, destroy)`` gets the report as of that call, with its deferred values
    read, and the original ``destroy`` to call (once) when it wants the group gone."""

    def __init__(self, session, on_destroy):
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
        return build_report(session.options, rec, resolved(snapshot(rec, variables)),
                            RunOutcome(), duration=time.perf_counter() - session.started)


class Checkpoints:
    """The provisional reports of a script check (``run_check``'s ``checkpoint``)."""

    def __init__(self, session, checkpoint, started: float):
        self.session = session
        self.checkpoint = checkpoint
        self.started = started
        self.last = -math.inf
        self.spent_writing = 0.0  # seconds spent on provisional reports so far
        self.cpu_started = time.process_time()
        self.cpu_writing = 0.0  # the process's CPU seconds spent on them so far

    def __call__(self, *_args, force: bool = False) -> None:
        now = time.perf_counter()
        if self.checkpoint is None:
            return
        rec = self.session.rec
        if not force:
            if not rec.progress.step_budget:  # unlimited replay: throttled
                if now - self.last < CHECKPOINT_EVERY_S or self.cpu_writing > (
                        CHECKPOINT_CPU_SHARE * (time.process_time() - self.cpu_started)):
                    return
            # (with a step budget: after every step)
            if self.spent_writing > CHECKPOINT_ALLOWANCE_S + CHECKPOINT_SHARE * (now - self.started):
                return  # and never more than a bounded share of the run's time
        self.last = now
        cpu = time.process_time()
        try:
            ending = RunOutcome(ended_by=Unfinished(), error={
                "type": "Unfinished", "location": None, "message": (
                    f"graddoctor did not finish: the process ended after {rec.progress.steps} optimizer "
                    f"steps (killed, out of memory, or stuck past the time limit in code that "
                    f"holds Python's lock); this report holds what was seen until then")})
            self.checkpoint(build_report(self.session.options, rec, snapshot(rec), ending,
                                         duration=now - self.started))
        except Exception as exc:
            rec.internal_error("provisional report", exc)
        finally:
            self.spent_writing += time.perf_counter() - now
            self.cpu_writing += time.process_time() - cpu
