"""The report's one wire format (graddoctor/report/json_format.py): what a rank or a spawned
worker hands over is read back whole, a framework's attribution included; and the rule stage
that compares processes (``Rule.check_processes``: replicas-diverge) is selected and
suppressed like any rule's findings. Every fixture's report goes through the same round trip in
tests/test_fixtures.py (tests/wire_round_trip.py)."""

from __future__ import annotations

import dataclasses
import json
import os

from conftest import run_cli
from graddoctor.rules.engine import selected_rules
from graddoctor.findings import Finding, ProcessFacts, Related, Severity
from graddoctor.report.json_format import from_dict, to_dict
from graddoctor.report.merge import Part, merge, single
from graddoctor.report.model import Report, RunInfo
from graddoctor.report.text import render as render_text
from graddoctor.rules import ALL_RULES, find_rule
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
                   world_size=2, rules=ALL_RULES)
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


# -- the stage that compares processes: replicas-diverge ----------------------------------------

def _rank(rank: int, values, path="train.py", line=16) -> Part:
    run = dataclasses.replace(_run(), checksums=[
        {"opt": 0, "step": s + 1, "value": v, "path": path, "line": line}
        for s, v in enumerate(values)])
    report = Report(run=run, findings=[])
    return Part(report, rank, f"rank {rank}")


def _diverging(**kw) -> list[Part]:
    return [_rank(0, [1.0, 2.0], **kw), _rank(1, [1.0, 2.5], **kw)]


def test_replicas_diverge_is_a_rule_with_a_stage_over_processes():
    rule = find_rule("replicas-diverge")
    facts = [ProcessFacts(p.rank, p.process, tuple(p.report.run.checksums)) for p in _diverging()]
    [found] = rule().check_processes(facts)
    assert (found.code, found.step, found.ranks, found.location.line) == ("GD403", 2, (0, 1), 16)
    # a rule that judges one trace compares nothing
    assert list(find_rule("missing-zero-grad")().check_processes(facts)) == []


def test_select_and_ignore_decide_whether_replicas_diverge_runs():
    def codes(rules):
        return [f.code for f in merge(_diverging(), world_size=2, rules=rules).findings]

    assert codes(selected_rules()) == ["GD403"]
    assert codes(selected_rules(select=["GD4"])) == ["GD403"]
    assert codes(selected_rules(ignore=["replicas-diverge"])) == []
    assert codes(selected_rules(select=["GD1"])) == []


def test_an_inline_comment_suppresses_replicas_diverge(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("\n" * 15 + "opt.step()  # graddoctor: ignore[replicas-diverge]\n"
                      "opt.step()\n")
    [found] = merge(_diverging(path=str(script)), world_size=2, rules=ALL_RULES).findings
    assert found.suppressed and found.code == "GD403"
    [found] = merge(_diverging(path=str(script), line=17), world_size=2, rules=ALL_RULES).findings
    assert not found.suppressed


def test_a_failing_process_rule_is_an_internal_error():
    class Broken(find_rule("replicas-diverge")):
        def check_processes(self, processes):
            raise RuntimeError("no checksums today")

    merged = merge(_diverging(), world_size=2, rules=[Broken])
    assert merged.findings == []
    assert merged.internal_errors == [{"where": "rule replicas-diverge",
                                       "error": "RuntimeError: no checksums today"}]


DIVERGING = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(0)
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(20):
    x, y = torch.randn(8, 4) * 10, torch.randn(8, 1)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if dist.get_rank() == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
"""


def test_a_two_rank_check_honours_ignore_and_inline_suppression(tmp_path):
    """One launch with --ignore replicas-diverge: rank 0's merge leaves it out (exit 0, where
    the divergence is an error), the ranks' own files record that it was left out and
    graddoctor merge leaves it out too; merged with every rule, the same files show it, and
    a comment on its line suppresses it."""
    script = tmp_path / "train.py"
    script.write_text(DIVERGING)
    done = run_cli("check", "--nproc-per-node", "2", "--steps", "4", "--ignore", "replicas-diverge",
                   "-o", "report.{rank}.json", "train.py", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    files = [str(tmp_path / f"report.{r}.json") for r in (0, 1)]
    parts = []
    for r, path in enumerate(files):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        assert data["run"]["rules"]["skipped"] == ["GD403"]
        parts.append(Part(from_dict(data), r, f"rank {r}"))
    again = run_cli("merge", *files, "--format", "json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["findings"] == []

    def merged_with_every_rule():
        cwd = os.getcwd()
        os.chdir(tmp_path)  # the reports' paths are relative to where the check ran
        try:
            return merge(parts, world_size=2, rules=ALL_RULES).findings
        finally:
            os.chdir(cwd)

    [found] = merged_with_every_rule()
    assert (found.code, found.location.line, found.suppressed) == ("GD403", 15, False)
    script.write_text(DIVERGING.replace("opt.step()\n",
                                        "opt.step()  # graddoctor: ignore[replicas-diverge]\n"))
    [found] = merged_with_every_rule()
    assert (found.code, found.suppressed) == ("GD403", True)
