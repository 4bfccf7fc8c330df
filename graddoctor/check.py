"""The library entry point: ``run_check(options) -> Report``.

runner -> instrument -> trace -> rules -> report, in one direction. The CLI is a thin layer
over this; tests call it in-process too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from .analyze import analyze, selected_rules
from .options import CheckOptions
from .report.model import Report, RunInfo
from .runner import ScriptError, run_target
from .suppress import apply_suppressions

__all__ = ["run_check", "ScriptError", "CheckOptions"]


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


def _device_of(rec) -> str:
    for pid in rec.tracked_pids():
        t = rec.tensor(pid)
        if t is not None:
            return t.device.type
    return "cpu"


def _epoch_notes(rec) -> list[str]:
    """Say when DataLoader epochs were replayed shorter than they are (``--epoch-batches``)."""
    short = [e for e in rec.trace.of_kind("epoch_start")
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


def run_check(options: CheckOptions, on_step=None) -> Report:
    """Replay the user's script under instrumentation and judge the trace.

    Raises ``ScriptError`` only when the target cannot be run at all; everything the script
    does (crash, exit, hang) ends up in the report's ``run.status``. ``on_step(n)`` is called
    after each optimizer step (a progress display).
    """
    import torch

    from .instrument import Instrumentation, Recorder
    from .location import LocationFinder

    finder = LocationFinder()
    rec = Recorder(step_budget=options.steps or None, finder=finder)
    if on_step is not None:
        rec.on_step.append(on_step)
    rec.emit("run_start", None, script=options.target, argv=list(options.args),
             device=options.device, torch_version=torch.__version__)
    started = time.perf_counter()
    redirect = contextlib.redirect_stdout(sys.stderr) if options.redirect_stdout else contextlib.nullcontext()
    with _device_policy(options.device), redirect:
        with Instrumentation(rec, options.epoch_batches) as instrumentation:
            outcome = run_target(options.target, list(options.args), module=options.module,
                                 timeout=options.timeout or None, finder=finder)
            instrumentation.script_globals = outcome.namespace
    duration = time.perf_counter() - started
    status = outcome.status
    if status == "completed" and rec.steps == 0 and rec.backward_calls == 0:
        status = "no-training-loop"
    rec.emit("run_end", None, status=status, steps=rec.steps)

    findings, rule_errors = analyze(rec.trace, selected_rules(options.select, options.ignore))
    findings = apply_suppressions(findings)  # `# graddoctor: ignore[...]` on the reported line
    internal = [{"where": e["where"], "error": e["error"]} for e in rec.trace.of_kind("internal_error")]
    internal += rule_errors
    if options.trace_path:
        with open(options.trace_path, "w", encoding="utf-8") as f:
            f.write(rec.trace.dumps())
    run = RunInfo(
        script=options.target, argv=list(options.args), status=status, steps=rec.steps,
        backward_calls=rec.backward_calls, device=_device_of(rec), torch_version=torch.__version__,
        duration_s=round(duration, 3), error=outcome.error,
        notes=[*outcome.notes, *_epoch_notes(rec)],
        step_budget=options.steps or None, config=options.config_path,
    )
    return Report(run=run, findings=findings, internal_errors=internal, trace=rec.trace)
