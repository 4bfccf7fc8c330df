"""The report's one wire format (graddoctor/report/json_format.py): what a rank or a spawned
worker hands over is read back whole, a framework's attribution included. Every fixture's
report goes through the same round trip in tests/test_fixtures.py (tests/wire_round_trip.py)."""

from __future__ import annotations

import dataclasses

from graddoctor.findings import Finding, Related, Severity
from graddoctor.report.json_format import to_dict
from graddoctor.report.merge import Part, merge, single
from graddoctor.report.model import Report, RunInfo
from graddoctor.report.text import render as render_text
from graddoctor.trace import Location
from reliability_helpers import validate
from wire_round_trip import NOT_ON_THE_WIRE, assert_round_trip, read_back


def _run(**kw) -> RunInfo:
    return RunInfo(script="train.py", argv=["--lr", "1"], status="step-limit", steps=4,
                   backward_calls=4, step_budget=4, torch_version="2.13.0+cpu", **kw)


def _framework_finding(**kw) -> Finding:
    at = Location("train.py", 20, "training_step", via="lightning", hook="training_step")
    return Finding(
        "missing-zero-grad", "GD101", Severity.ERROR, "gradients accumulate", at,
        fix="call zero_grad",
        related=(Related(Location("train.py", 24, "training_step"), "the step"),),
        step=2, evidence={"params": ("w", "b"), "scale": float("nan"), "k": 3}, **kw)


def test_a_framework_call_keeps_its_attribution_across_a_process_boundary():
    report = Report(run=_run(), findings=[_framework_finding()],
                    internal_errors=[{"where": "rule x", "error": "boom"}])
    back = assert_round_trip(report)
    assert (back.findings[0].location.via, back.findings[0].location.hook) == \
        ("lightning", "training_step")
    # rank 0 merges a rank's report read back from its JSON: the text still says whose call it is
    part = single(report, 1, "rank 1", 4242, 2)
    merged = merge([Part(_report_of_rank(0), 0, "rank 0"), Part(read_back(part), 1, "rank 1")],
                   world_size=2)
    assert_round_trip(merged)
    text = render_text(merged)
    assert "made for" in text and "training_step" in text, text


def _report_of_rank(rank: int) -> Report:
    return single(Report(run=_run(), findings=[]), rank, f"rank {rank}", 100 + rank, 2)


def test_merged_fields_survive_a_second_merge():
    merged = Report(run=_run(world_size=2, ranks=[
        {"rank": 0, "process": "rank 0", "pid": 1, "status": "step-limit", "steps": 4,
         "backward_calls": 4, "error": None}]),
        findings=[_framework_finding(ranks=(0, 1), processes=("main process",)),
                  _framework_finding(ranks=None, processes=("worker pid 7",), suppressed=True)])
    back = assert_round_trip(merged)
    assert [(f.ranks, f.processes, f.suppressed) for f in back.findings] == \
        [((0, 1), ("main process",), False), ((), ("worker pid 7",), True)]
    validate(to_dict(back))


def test_the_wire_names_every_field_it_leaves_out():
    for cls, left_out in NOT_ON_THE_WIRE.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert left_out <= names, (cls, left_out - names)
