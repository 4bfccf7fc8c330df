"""One report from several processes: the ranks of a distributed run, the workers a script
spawned. Pure data (no torch): ``merge(parts)`` joins the findings of every part, each saying
which ranks (or processes) saw it, and keeps one status line per process in ``run.ranks``.

The parts come as ``Report`` objects (the process that merges has its own) or as the JSON of
the other processes' reports (read back by report/json_format.py, the wire format): what
crosses a process or machine boundary is the JSON report, so ``graddoctor merge`` can join
files written on different nodes. The rules that compare processes (``Rule.check_processes``:
replicas-diverge, ranks-same-batches) run here, over the rules the caller selected.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, replace

from ..findings import Finding, ProcessFacts, spans
from ..status import RunStatus, decide_status, worst
from ..suppress import apply_suppressions
from .model import Report, RunInfo


@dataclass
class Part:
    """One process's report and who it was."""

    report: Report
    rank: int | None
    process: str  # "rank 1", "main process", "spawned pid 4242"
    pid: int | None = None


def rank_label(rank: int | None, pid: int | None = None) -> str:
    return f"rank {rank}" if rank is not None else f"pid {pid}"


def seen_on(finding: Finding) -> str | None:
    """``rank 0–1``, ``rank 1 only``, ``main process only``: where a merged finding was seen."""
    if finding.ranks is None and not finding.processes:
        return None
    parts = []
    ranks = list(finding.ranks or ())
    if ranks:
        parts.append("rank " + spans(ranks))
    parts.extend(finding.processes)
    text = ", ".join(parts)
    alone = len(ranks) + len(finding.processes) == 1
    return f"{text} only" if alone else text


def entries(part: Part) -> list[dict]:
    """The ``run.ranks`` entries a part brings: its own, or those of a report merged before."""
    run = part.report.run
    if run.ranks:
        return [dict(e) for e in run.ranks]
    return [{"rank": part.rank, "process": part.process, "pid": part.pid, "status": run.status,
             "steps": run.steps, "backward_calls": run.backward_calls, "error": run.error}]


def missing_entry(rank: int | None, process: str, why: str) -> dict:
    return {"rank": rank, "process": process, "pid": None, "status": RunStatus.MISSING, "steps": 0,
            "backward_calls": 0, "error": {"type": "Missing", "message": why, "location": None}}


_COMMUNICATION = ("connection closed by peer", "remote worker", "gloo", "nccl", "timed out",
                  "distbackenderror", "connection reset", "broken pipe",
                  # a rank the launcher stopped, or ended without its report, because another
                  # one failed
                  "sigterm", "the launcher ended the run")


def communication_error(error: dict | None) -> bool:
    """An error that is probably another rank's failure (or its end) seen through a collective
    or a send/recv."""
    if not error:
        return False
    text = f"{error.get('type', '')} {error.get('message', '')}".lower()
    return any(word in text for word in _COMMUNICATION)


def _who(entries: list[dict]) -> str:
    """``rank 3``, ``rank 1–4, 9``: the processes of a group of rank entries."""
    ranks = sorted(e["rank"] for e in entries if e["rank"] is not None)
    others = [e["process"] for e in entries if e["rank"] is None]
    return ", ".join(([f"rank {spans(ranks)}"] if ranks else []) + others)


def _owners(part: Part, finding: Finding) -> tuple[set[int], list[str]]:
    if finding.ranks is not None or finding.processes:  # already merged once
        return set(finding.ranks or ()), list(finding.processes)
    return ({part.rank}, []) if part.rank is not None else (set(), [part.process])


def merge(parts: list[Part], *, world_size: int | None = None, missing: list[dict] = (),
          notes: list[str] = (), fail_on: str = "warning", allow_incomplete: bool = False,
          views: bool = True, rules=()) -> Report:
    """One report from the parts (the first one leads: its script, steps and, with ``views``,
    update timeline). ``notes``: on the run as a whole, after the parts'; ``fail_on`` and
    ``allow_incomplete``: the merged report's verdict; ``rules``: the rule classes the check
    selected, whose cross-process stage runs here.

    Findings are the same when they have the same rule, severity... and place: (code, location,
    suppressed); the first part's message is kept and the ranks of all are listed. A process
    that trained nothing (``no-training-loop``: an mp.spawn parent) does not decide the status
    while another one trained. ``rules``: those selected for the check, for the ones that
    compare processes (``across_processes``)."""
    if not parts:
        raise ValueError("nothing to merge")
    lead = parts[0].report
    rank_entries = [e for part in parts for e in entries(part)] + [dict(m) for m in missing]
    rank_entries.sort(key=lambda e: (e["rank"] is None, e["rank"] if e["rank"] is not None else 0,
                                     e["process"]))
    groups: dict[tuple, list] = {}
    for part in parts:
        for f in part.report.findings:
            loc = (f.location.path, f.location.line) if f.location else None
            key = (f.code, loc, f.suppressed)
            ranks, processes = _owners(part, f)
            if key not in groups:
                groups[key] = [f, set(ranks), list(processes)]
                continue
            group = groups[key]
            if f.severity.rank > group[0].severity.rank:
                group[0] = f
            group[1] |= ranks
            group[2] += [p for p in processes if p not in group[2]]
    findings = [replace(f, ranks=tuple(sorted(ranks)), processes=tuple(processes))
                for f, ranks, processes in groups.values()]
    world = world_size or max(p.report.run.world_size for p in parts)
    by_code = {rule.code: rule for rule in rules}
    for i, f in enumerate(findings):  # what a bug on some ranks does to every rank's update
        if f.code in by_code and f.ranks:
            try:
                findings[i] = by_code[f.code]().across_ranks(f, world)
            except Exception:
                pass  # the finding as the rank said it
    compared, rule_errors = across_processes(parts, rules)
    findings += compared
    findings.sort(key=lambda f: (-f.severity.rank, f.location.path if f.location else "",
                                 f.location.line if f.location else 0, f.code))
    status = decide_status(parts=[e["status"] for e in rank_entries])
    judged = [e for e in rank_entries if e["status"] != RunStatus.NO_TRAINING_LOOP] or rank_entries
    failing = worst(e["status"] for e in judged)  # missing, where the status says crashed
    error, echoes = None, []
    # the root cause first: a rank whose peer failed reports a communication error
    # (a rank gone without a report comes before the ranks that only saw it go)
    failed = sorted((e for e in judged if e["status"] in (failing, RunStatus.MISSING)
                     and e.get("error")),
                    key=lambda e: (communication_error(e["error"]), e["status"] != failing))
    echoed: dict[str, list] = {}  # one note per distinct error, with the ranks that saw it
    for e in failed:
        if error is None:
            error = dict(e["error"])
            if len(rank_entries) > 1:
                error["message"] = f"{e['process']}: {error['message']}"
        elif e["status"] != RunStatus.MISSING:
            message = str(e["error"].get("message", ""))
            text = f"{e['error'].get('type')}: {message[:200]}{' …' if len(message) > 200 else ''}"
            echoed.setdefault(text, []).append(e)
    echoes = [f"{_who(group)} failed too: {text}" for text, group in echoed.items()]
    first = next((e for e in rank_entries
                  if e["status"] not in (RunStatus.MISSING, RunStatus.NO_TRAINING_LOOP)),
                 rank_entries[0])
    about_run, notes, internal = notes, [], []
    # each note once: in every part's report (said once), or in some (said with the process);
    # counted in one pass, so thousands of ranks with notes of their own merge in linear time
    holders: dict[str, int] = {}
    for part in parts:
        for note in dict.fromkeys(part.report.run.notes):
            holders[note] = holders.get(note, 0) + 1
    written: set[str] = set()
    for part in parts:
        label = "" if len(parts) == 1 else f"{part.process}: "
        for note in part.report.run.notes:
            text = note if holders[note] == len(parts) else f"{label}{note}"
            if note in written or text in written:
                continue
            written.add(text)
            notes.append(text)
        internal += [{"where": f"{label}{e['where']}", "error": e["error"]}
                     for e in part.report.internal_errors]
    notes += echoes
    lead_message = error["message"] if error is not None else None
    grouped: dict[str, list] = {}  # the ranks missing for one reason: one note
    for m in missing:
        if lead_message == f"{m['process']}: {m['error']['message']}":
            continue
        grouped.setdefault(m["error"]["message"], []).append(m)
    notes += [f"{_who(group)}: {message}" for message, group in grouped.items()]
    notes += about_run
    run = RunInfo(
        script=lead.run.script, argv=list(lead.run.argv), status=status,
        steps=first["steps"], backward_calls=first["backward_calls"], device=lead.run.device,
        torch_version=lead.run.torch_version,
        duration_s=max(p.report.run.duration_s for p in parts), error=error, notes=notes,
        step_budget=lead.run.step_budget, config=lead.run.config, rules_skipped=lead.run.rules_skipped,
        world_size=world_size or max([p.report.run.world_size for p in parts] + [len(rank_entries)]),
        ranks=rank_entries,
        # one rank's own report keeps its checksums for the merge that compares them
        checksums=lead.run.checksums if len(parts) == 1 and not missing else None,
        batch_fingerprints=lead.run.batch_fingerprints if len(parts) == 1 and not missing else None,
        run_id=lead.run.run_id if all(p.report.run.run_id == lead.run.run_id for p in parts)
        else None,
    )
    analysis = next((p.report.analysis for p in parts if p.report.analysis is not None), None) \
        if views else None
    return Report(run=run, findings=findings, internal_errors=internal + rule_errors,
                  analysis=analysis, fail_on=fail_on, allow_incomplete=allow_incomplete)


def across_processes(parts: list[Part], rules) -> tuple[list[Finding], list[dict]]:
    """The findings (and internal errors) of the rules that compare the processes of a run
    (``Rule.check_processes``). ``rules``: the rule classes the check selected, passed in (the
    report layer knows no rule registry). Inline suppressions apply to these findings as to a
    process's own."""
    processes = [ProcessFacts(p.rank, p.process, tuple(p.report.run.checksums or ()),
                              tuple(p.report.run.batch_fingerprints or ()))
                 for p in parts]
    found, errors = [], []
    for rule in rules:
        try:
            found.extend(rule().check_processes(processes))
        except Exception as exc:
            errors.append({"where": f"rule {rule.slug}",
                           "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()})
    return apply_suppressions(found, parts[0].report.base_dir), errors


def single(report: Report, rank: int | None, process: str, pid: int | None,
           world_size: int) -> Report:
    """A process's own report marked as one part of a larger run (a per-rank file): its
    ``run.ranks`` entry and its findings' ranks, so that ``graddoctor merge`` can join it."""
    return merge([Part(report, rank, process, pid)], world_size=world_size,
                 fail_on=report.fail_on, allow_incomplete=report.allow_incomplete)


# -- the per-rank report files of one run (`graddoctor merge`, api.merge_reports) -------------

class MergeError(ValueError):
    """The report files cannot be merged (none readable, a plain process's, another run's, a
    rank twice); the message says which and why."""


@dataclass
class _Files:
    """The files read so far: the parts, the file of each, and what could not be read."""

    parts: list[Part]
    paths: dict[int, str]  # id(part) -> its file
    skipped: set[str]  # rules the checks left out
    notes: list[str]
    unreadable: dict[int, str]  # rank (from the file name) -> why


def merge_files(paths: list[str], *, fail_on: str = "warning",
                allow_incomplete: bool = False) -> Report:
    """One report from the JSON reports of the ranks of one distributed run (``graddoctor
    merge``): each finding says on which ranks it was seen; a rank without a readable report
    is missing (the run is incomplete). ``fail_on`` and ``allow_incomplete`` (validated by the
    caller, options.py) make the verdict. ``MergeError`` when the files cannot be joined."""
    from ..rules.engine import selected_rules

    files = _read_files(paths)
    _one_run(files)
    parts = _without_merged_before(files)
    seen = _by_rank(parts, files.paths)
    world = max(p.report.run.world_size for p in parts)
    missing = [missing_entry(r, f"rank {r}", files.unreadable.get(
        r, "no report file was given for this rank")) for r in range(world) if r not in seen]
    notes = files.notes + [why for r, why in files.unreadable.items() if r in seen or r >= world]
    parts.sort(key=lambda p: (p.rank is None, p.rank or 0))
    return merge(parts, world_size=world, missing=missing, notes=notes, fail_on=fail_on,
                 allow_incomplete=allow_incomplete,
                 rules=selected_rules(ignore=sorted(files.skipped)))


def _read_files(paths: list[str]) -> _Files:
    """Every readable report file as a part; one corrupt file (a rank killed while writing it)
    must not hide the others: it is noted, under its rank when its name ends in one."""
    import json
    import os
    import re

    from .json_format import from_dict

    files = _Files([], {}, set(), [], {})
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            report = from_dict(data)
        except OSError as exc:
            raise MergeError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            found = re.search(r"(\d+)\D*$", os.path.basename(path))
            why = f"unreadable report file {path} ({type(exc).__name__}: {exc})"
            if found:
                files.unreadable[int(found.group(1))] = why
            else:
                files.notes.append(why)
            continue
        files.skipped.update(report.run.rules_skipped)
        entries = report.run.ranks or []
        rank = entries[0]["rank"] if len(entries) == 1 else None
        files.parts.append(Part(report, rank, entries[0]["process"] if len(entries) == 1 else path))
        files.paths[id(files.parts[-1])] = path
    if not files.parts:
        raise MergeError("none of the reports could be read: " + "; ".join(
            [*files.unreadable.values(), *files.notes]))
    return files


def _one_run(files: _Files) -> None:
    """Ranks' reports (not a single process's) of one run: the same command and run id."""
    plain = [p for p in files.parts if not p.report.run.ranks]
    if plain:
        raise MergeError(f"{plain[0].process} is the report of a single process, not of a rank "
                         "(write the ranks' reports under torchrun with -o 'report.{rank}.json')")
    runs: dict[tuple, list[str]] = {}
    for p in files.parts:
        run = p.report.run
        runs.setdefault((run.script, tuple(run.argv), run.run_id, run.world_size), []).append(
            files.paths[id(p)])
    if len({key[:2] for key in runs}) > 1 or len({key[2] for key in runs} - {None}) > 1 \
            or len({key[3] for key in runs}) > 1:
        groups = "; ".join(f"{', '.join(who)}: {' '.join([script, *argv])}"
                           f"{f' (run {run_id})' if run_id else ''}, world size {world}"
                           for (script, argv, run_id, world), who in runs.items())
        raise MergeError(f"these reports are of different runs, which merge cannot join: {groups}")


def _without_merged_before(files: _Files) -> list[Part]:
    """The parts but a report merged before (merge's own output in the glob) beside its ranks'
    own files, which is noted instead."""
    own = {p.rank for p in files.parts if p.rank is not None}
    kept = []
    for p in files.parts:
        ranks_in = {e["rank"] for e in p.report.run.ranks}
        if p.rank is None and ranks_in & own:
            files.notes.append(f"{p.process} is a report merged before (rank "
                               f"{spans(sorted(ranks_in))}): left out, the ranks' own reports "
                               f"are given")
            continue
        kept.append(p)
    return kept


def _by_rank(parts: list[Part], paths: dict[int, str]) -> set[int]:
    """The ranks the parts cover; each rank's report given once."""
    by_rank: dict[int, Part] = {}
    for p in parts:
        for e in p.report.run.ranks:
            if e["rank"] is None:
                continue
            other = by_rank.get(e["rank"])
            if other is not None and other is not p:
                raise MergeError(f"rank {e['rank']} is given twice ({paths[id(other)]} and "
                                 f"{paths[id(p)]}): give each rank's report once")
            by_rank[e["rank"]] = p
    return set(by_rank)
