"""replicas-diverge (GD403): the ranks' parameter checksums compared when their reports are merged
(pure: no process group)."""

from __future__ import annotations

from dataclasses import replace

from graddoctor.report.json_format import to_dict
from graddoctor.report.json_format import from_dict
from graddoctor.report.merge import Part, merge, single
from graddoctor.rules import ALL_RULES
from graddoctor.report.model import Report, RunInfo
from reliability_helpers import validate


def test_replicas_diverge_compares_the_ranks_checksums():
    def part(rank, values, path="train.py"):
        report = Report(run=RunInfo(script="train.py", argv=[], status="step-limit", steps=10,
                                    backward_calls=10, step_budget=10, torch_version="2.13.0+cpu"),
                        findings=[])
        report = replace(report, run=replace(report.run, checksums=[
            {"opt": 0, "step": s + 1, "value": v, "path": path, "line": 16}
            for s, v in enumerate(values)]))
        return Part(report, rank, f"rank {rank}")

    same = merge([part(0, [1.0, 2.0, 3.0]), part(1, [1.0, 2.0 * (1 + 1e-7), 3.0])], world_size=2,
                 rules=ALL_RULES)
    assert same.findings == []  # last-bit differences of an all-reduce are not a divergence
    split = merge([part(0, [1.0, 2.0, 3.0]), part(1, [1.0, 2.5, 3.5]), part(2, [1.0, 2.0, 3.0])],
                  world_size=3, rules=ALL_RULES)
    assert [(f.rule, f.step, f.location.line, f.evidence["differing_ranks"]) for f in split.findings] \
        == [("replicas-diverge", 2, 16, [1])]
    # a rank's own report keeps its checksums in JSON, so that graddoctor merge can compare them
    data = to_dict(single(part(1, [1.0]).report, 1, "rank 1", None, 2))
    validate(data)
    assert data["run"]["checksums"][0]["value"] == 1.0
    assert from_dict(data).run.checksums == data["run"]["checksums"]


def test_ranks_without_ddp_are_compared_when_they_start_as_replicas():
    def part(rank, values, layout=7, initial=5.0):
        report = Report(run=RunInfo(script="train.py", argv=[], status="step-limit", steps=10,
                                    backward_calls=10, step_budget=10, torch_version="2.13.0+cpu"),
                        findings=[])
        report = replace(report, run=replace(report.run, checksums=[
            {"opt": 0, "step": s + 1, "value": v, "path": "train.py", "line": 16,
             "layout": layout, "initial": initial} for s, v in enumerate(values)]))
        return Part(report, rank, f"rank {rank}")

    drift = merge([part(0, [1.0, 2.0]), part(1, [1.5, 2.5])], world_size=2, rules=ALL_RULES)
    [f] = drift.findings
    assert f.rule == "replicas-diverge" and f.step == 1
    assert "no DistributedDataParallel" in f.message and "DistributedDataParallel" in f.fix
    # a pipeline (other shapes per rank) and models seeded per rank are no replicas
    stages = merge([part(0, [1.0]), part(1, [3.0], layout=8)], world_size=2, rules=ALL_RULES)
    seeded = merge([part(0, [1.0]), part(1, [3.0], initial=6.0)], world_size=2, rules=ALL_RULES)
    assert stages.findings == [] and seeded.findings == []
    # gradients averaged by hand: the same values on every rank
    same = merge([part(0, [1.0, 2.0]), part(1, [1.0, 2.0])], world_size=2, rules=ALL_RULES)
    assert same.findings == []
    data = to_dict(single(part(1, [1.0]).report, 1, "rank 1", None, 2))
    validate(data)
