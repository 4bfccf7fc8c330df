"""Distributed runs: the merge of per-rank reports (pure), per-rank paths, ``graddoctor merge``,
and two real 2-rank launches on CPU (gloo): the DDP fixtures (fixtures/ddp/, all in one
launch through tests/ddp_harness.py) and ``graddoctor check --nproc-per-node 2`` end to end."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import FIXTURES, ROOT, run_cli, run_python
from fixture_marks import Seen, compare, read_marks, read_silent
from graddoctor.run.ranks import rank_env, rank_path
from graddoctor.findings import Finding, Severity
from graddoctor.report.json_format import from_dict, load_schema, to_dict
from graddoctor.report.merge import Part, merge, missing_entry, seen_on, single, spans
from graddoctor.report.model import Report, RunInfo
from graddoctor.report.text import render
from graddoctor.rules import ALL_RULES
from graddoctor.trace import Location
from reliability_helpers import validate
from wire_round_trip import assert_round_trip

# the DDP fixtures checked in one launch, in-process one after another; those checked with
# --emulate-cuda run through the CLI (test_emulated_cuda_ddp_fixtures_through_the_cli): ended by
# the step budget, their DDP reducer's gloo group is torn down with the script's frame, and gloo's
# worker threads, waiting for the GIL to free a tensor, deadlock against the join of that
# teardown; a rank of the CLI hands its report over and exits without waiting for the teardown
ALL_DDP_FIXTURES = sorted(glob.glob(os.path.join(FIXTURES, "ddp", "*.py")))
EMULATED_DDP_FIXTURES = [p for p in ALL_DDP_FIXTURES if "--emulate-cuda" in read_marks(p)[1]]
DDP_FIXTURES = [p for p in ALL_DDP_FIXTURES if p not in EMULATED_DDP_FIXTURES]


def _report(status="step-limit", steps=10, findings=(), error=None) -> Report:
    run = RunInfo(script="train.py", argv=[], status=status, steps=steps, backward_calls=steps,
                  error=error, step_budget=10, torch_version="2.13.0+cpu")
    return Report(run=run, findings=list(findings))


def _finding(line=12, code="GD101", rule="missing-zero-grad", severity=Severity.ERROR):
    return Finding(rule, code, severity, "gradients accumulate", Location("train.py", line),
                   fix="call zero_grad", step=2)


def test_spans_and_where_a_finding_was_seen():
    assert spans([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7–8"
    f = _finding()
    assert seen_on(f) is None  # a single process: no rank line
    assert seen_on(Finding(**{**f.__dict__, "ranks": (0, 1)})) == "rank 0–1"
    assert seen_on(Finding(**{**f.__dict__, "ranks": (1,)})) == "rank 1 only"
    assert seen_on(Finding(**{**f.__dict__, "ranks": (), "processes": ("main process",)})) == \
        "main process only"


def test_merge_joins_findings_and_keeps_each_rank_status():
    parts = [Part(_report(findings=[_finding(), _finding(20, "GD103", "stale-grad", Severity.WARNING)]),
                  0, "rank 0", 11),
             Part(_report(findings=[_finding()]), 1, "rank 1", 12)]
    merged = merge(parts, world_size=2)
    assert [(f.code, f.ranks) for f in merged.findings] == [("GD101", (0, 1)), ("GD103", (0,))]
    data = to_dict(merged)
    validate(data)
    assert data["run"]["world_size"] == 2
    assert [(e["rank"], e["status"], e["pid"]) for e in data["run"]["ranks"]] == \
        [(0, "step-limit", 11), (1, "step-limit", 12)]
    assert data["findings"][0]["ranks"] == [0, 1] and data["findings"][1]["ranks"] == [0]
    text = render(merged)
    assert "world size 2 · rank 0–1: step-limit, 10 steps" in text
    assert "seen on rank 0–1" in text and "seen on rank 0 only" in text
    # a merged report read back and merged again (graddoctor merge of merges) is the same
    again = merge([Part(from_dict(json.loads(json.dumps(data))), None, "merged")], world_size=2)
    assert to_dict(again)["findings"] == data["findings"]


def test_a_crashed_or_missing_rank_makes_the_run_incomplete():
    crash = {"type": "RuntimeError", "message": "boom", "location": None}
    parts = [Part(_report(), 0, "rank 0"), Part(_report("crashed", 3, error=crash), 1, "rank 1")]
    merged = merge(parts, world_size=3, missing=[missing_entry(2, "rank 2", "no report within 60 s")])
    assert merged.run.status == "crashed" and merged.run.error["message"] == "rank 1: boom"
    assert [e["status"] for e in merged.run.ranks] == ["step-limit", "crashed", "missing"]
    assert any("rank 2: no report within 60 s" in n for n in merged.run.notes)
    validate(to_dict(merged))
    only_missing = merge([Part(_report(), 0, "rank 0")], world_size=2,
                         missing=[missing_entry(1, "rank 1", "no report")])
    assert only_missing.run.status == "crashed" and only_missing.run.error["type"] == "Missing"


def test_a_parent_without_a_loop_does_not_decide_the_status():
    parts = [Part(_report("no-training-loop", 0), None, "main process"),
             Part(_report(findings=[_finding()]), 0, "rank 0")]
    merged = merge(parts)
    assert merged.run.status == "step-limit" and merged.run.steps == 10
    assert merged.exit_code("warning") == 1


def test_rank_env_and_per_rank_paths():
    assert rank_env({}) is None
    assert rank_env({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: not distributed
    env = rank_env({"RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "MASTER_ADDR": "h", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"})
    assert (env.rank, env.world_size, env.store, env.prefix) == (1, 4, ("h", 29500), "graddoctor/x/0")
    assert rank_env({"RANK": "1", "WORLD_SIZE": "2"}).store is None  # no agent store
    assert rank_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}).rank == 3
    assert rank_path("out/r.{rank}.json", 3) == "out/r.3.json"
    assert rank_path("out/report.json", 1) == "out/report.rank1.json"


def test_merge_command_joins_per_rank_files(tmp_path):
    paths = []
    for rank, findings in ((0, []), (1, [_finding()])):
        part = single(_report(findings=findings), rank, f"rank {rank}", 100 + rank, 2)
        path = tmp_path / f"r.{rank}.json"
        path.write_text(json.dumps(to_dict(part)))
        paths.append(str(path))
    done = run_cli("merge", *paths, "--format", "json")
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    validate(data)
    assert data["findings"][0]["ranks"] == [1] and data["run"]["world_size"] == 2
    half = run_cli("merge", paths[1], "--fail-on", "never")
    # a rank whose report is missing makes the merged check incomplete: exit 2 whatever --fail-on
    assert half.returncode == 2 and "rank 0: missing" in half.stdout, half.stdout
    allowed = run_cli("merge", paths[1], "--fail-on", "never", "--allow-incomplete")
    assert allowed.returncode == 0, allowed.stdout
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(to_dict(_report())))
    assert run_cli("merge", str(plain)).returncode == 2


def _launch(*args, timeout=900) -> subprocess.CompletedProcess:
    """The launcher forked warm (conftest.run_python); the ranks it starts are fresh
    interpreters, as torchrun starts them. The limit only catches a hang: every DDP fixture in
    one launch takes ~2 min on an idle 2-core machine and over 4 on a loaded one."""
    return run_python(*args, timeout=timeout)


def test_ddp_fixtures_in_one_two_rank_launch(tmp_path):
    assert DDP_FIXTURES
    done = _launch("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   os.path.join(ROOT, "tests", "ddp_harness.py"), str(tmp_path), *DDP_FIXTURES)
    assert done.returncode == 0, done.stderr[-3000:]
    problems = []
    for path in DDP_FIXTURES:
        name = os.path.basename(path)
        parts = [Part(from_dict(json.loads((tmp_path / f"{name}.rank{r}.json").read_text())),
                      r, f"rank {r}") for r in (0, 1)]
        report = merge(parts, world_size=2, rules=ALL_RULES)
        assert report.run.status in ("completed", "step-limit"), (name, report.run)
        assert not report.internal_errors, (name, report.internal_errors)
        assert_round_trip(report)
        expectations, _ = read_marks(path)
        found = [Seen(f.location.path if f.location else None,
                      f.location.line if f.location else None, f.rule, f.severity.value)
                 for f in report.findings]
        silent = read_silent(path) if name.startswith("good_") else None
        problems += compare(expectations, found, name, silent)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", EMULATED_DDP_FIXTURES, ids=os.path.basename)
def test_emulated_cuda_ddp_fixtures_through_the_cli(path, tmp_path):
    out = tmp_path / "report.json"
    done = run_python("-m", "graddoctor", "check", "--nproc-per-node", "2", "--emulate-cuda",
                      "--format", "json", "-o", str(out), os.path.basename(path),
                      cwd=os.path.dirname(path), timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = from_dict(json.loads(out.read_text()))
    name = os.path.basename(path)
    assert report.run.status in ("completed", "step-limit"), (name, report.run)
    assert not report.internal_errors, (name, report.internal_errors)
    expectations, _ = read_marks(path)
    found = [Seen(f.location.path if f.location else None,
                  f.location.line if f.location else None, f.rule, f.severity.value)
             for f in report.findings]
    silent = read_silent(path) if name.startswith("good_") else None
    problems = compare(expectations, found, name, silent)
    assert not problems, "\n".join(problems)


def test_nproc_per_node_gives_one_report_with_the_ranks_of_each_finding(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\n"
        "torch.manual_seed(0)\n"
        "model = DDP(torch.nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(20):\n"
        "    if dist.get_rank() == 0:\n"
        "        opt.zero_grad()\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()\n")
    out = tmp_path / "report.json"
    done = _launch("-m", "graddoctor", "check", "--nproc-per-node", "2", "--steps", "4", "--format", "json",
                   "-o", str(out), str(script))
    # rank 1 found the bug and still exited 0: no rank was killed, rank 0 exits by the merge
    assert done.returncode == 1, done.stderr[-3000:]
    assert "ChildFailedError" not in done.stderr and "without its report" not in done.stderr
    data = json.loads(out.read_text())
    validate(data)
    assert data["run"]["world_size"] == 2
    assert [(e["rank"], e["status"]) for e in data["run"]["ranks"]] == \
        [(0, "step-limit"), (1, "step-limit")]
    assert [(f["rule"], f["ranks"], f["location"]["line"]) for f in data["findings"]] == \
        [("missing-zero-grad", [1], 10)]
    assert not os.path.exists(tmp_path / "report.rank1.json")  # one report, by rank 0


def test_the_launcher_as_the_target_is_a_usage_error_that_names_the_right_command():
    for args in (["-m", "torch.distributed.run", "--", "--nproc_per_node", "2", "train.py"],
                 [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--", "train.py"]):
        done = run_cli("check", *args)
        assert done.returncode == 2, done.stderr
        assert "--nproc-per-node N train.py" in done.stderr and "Traceback" not in done.stderr


def test_the_root_cause_leads_when_a_peer_saw_the_crash_through_a_collective():
    echo = {"type": "RuntimeError", "location": None,
            "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer"}
    cause = {"type": "RuntimeError", "message": "bad batch on rank 1", "location": None}
    merged = merge([Part(_report("crashed", 3, error=echo), 0, "rank 0"),
                    Part(_report("crashed", 3, error=cause), 1, "rank 1")], world_size=2)
    assert merged.run.error["message"] == "rank 1: bad batch on rank 1"
    assert any(n.startswith("rank 0 failed too: RuntimeError:") for n in merged.run.notes)


def test_sarif_of_a_merged_report_says_where_each_finding_was_seen(tmp_path):
    import jsonschema

    from graddoctor.report.sarif import to_sarif

    merged = merge([Part(_report(findings=[_finding()]), 0, "rank 0"),
                    Part(_report(), 1, "rank 1")], world_size=2)
    sarif = to_sarif(merged)
    schema = json.loads(open(os.path.join(ROOT, "tests", "data", "sarif-schema-2.1.0.json")).read())
    jsonschema.validate(sarif, schema)
    result = sarif["runs"][0]["results"][0]
    assert result["message"]["text"].startswith("[seen on rank 0 only] ")
    assert result["properties"]["ranks"] == [0]
