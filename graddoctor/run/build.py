"""A run's one ``Report``, built from its recorder, trace and ending (``build_report``): the
status decided, the rules and run notes run over the trace, suppressions applied, other
processes' parts merged in. Used for the final report and for those written while the script
still runs (run/interim.py)."""

from __future__ import annotations

import os

from .. import events as ev
from ..analysis import Analysis
from ..options import CheckOptions
from ..report.merge import Part, merge
from ..report.model import Report, RunInfo
from ..rules import ALL_RULES
from ..rules.engine import analyze, selected_rules
from ..rules.notes import gradient_apis, run_notes
from ..status import RunStatus, decide_status
from ..suppress import apply_suppressions
from ..trace import Trace
from .ending import RunOutcome

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
    if options.emulate_cuda:
        device = f"cuda (emulated on {device})"
    checksums = [{"opt": e["opt"], "step": e["step"], "value": e["value"],
                  "path": e.loc.path if e.loc else None, "line": e.loc.line if e.loc else None,
                  **({"layout": e["layout"], "initial": e.get("initial")} if "layout" in e.data else {}),
                  **({"bypassed": True} if e.get("bypassed") else {})}
                 for e in analysis.of_kind("replica_checksum")]
    prints = [{"loader": e["loader"], "epoch": e["epoch"], "index": e["index"], "value": e["value"],
               "sampler": e["sampler"], "replicas": e["replicas"],
               "path": e.loc.path if e.loc else None, "line": e.loc.line if e.loc else None,
               **_sampler_rank_line(analysis, e)}
              for e in analysis.of_kind("batch_fingerprint")]
    run = RunInfo(
        checksums=checksums or None, batch_fingerprints=prints or None,
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


def _sampler_rank_line(analysis, e) -> dict:
    """``{"sampler_line": n}``: the line of the script's one ``DistributedSampler(...)`` call
    that gives ``rank=`` (or ``num_replicas=``) by hand, for a fingerprint of a loader whose
    sampler has both (ranks-same-batches points there when every rank got the same ones);
    {} when there is no such single call or the source cannot be read."""
    try:
        if e.loc is None or e["replicas"] is None:
            return {}
        found = analysis.source.keyword_argument(e.loc.path, "DistributedSampler",
                                                 ("rank", "num_replicas"))
        return {"sampler_line": found[0]} if found is not None else {}
    except Exception:
        return {}
