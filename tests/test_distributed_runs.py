"""Distributed runs that always finish: what rank 0 compares (replicated parameters only), a
peer's stop at the step budget, run ids against stale files, liveness (a dead rank seen in a
second, through the store's logs and /proc), ``graddoctor merge`` on files it must not trust,
and a few real launches (``--nproc-per-node 1``, SIGTERM to the launcher). Most tests drive
run/ranks.py in-process with a real ``TCPStore``; the launches are the few that need processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from conftest import ROOT, cli_env, run_cli
from graddoctor.findings import Finding, Severity
from graddoctor.options import CheckOptions
from graddoctor.report.json_format import render, to_dict
from graddoctor.report.merge import Part, merge, missing_entry, single
from graddoctor.report.model import Report, RunInfo
from graddoctor.rules import ALL_RULES
from graddoctor.run.ranks import (Exchange, RankEnv, describe_exit, gather, rank_env,
                                  rank_report, settled_at_budget)
from graddoctor.trace import Location
from reliability_helpers import validate


def _report(status="step-limit", steps=10, script="train.py", argv=(), error=None,
            checksums=None, findings=()) -> Report:
    run = RunInfo(script=script, argv=list(argv), status=status, steps=steps,
                  backward_calls=steps, error=error, step_budget=10, checksums=checksums,
                  torch_version="2.13.0+cpu")
    return Report(run=run, findings=list(findings))


def _options(**kw):
    return CheckOptions(target="train.py", **kw)


class _Store:
    """A real TCPStore server on a free port (rank 0's peers are simulated by writing to it)."""

    def __enter__(self):
        self.server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=10))
        return self

    def env(self, rank, world, run_id="torchrun:r/0"):
        return RankEnv(rank, world, ("127.0.0.1", self.server.port), "graddoctor/r/0", run_id)

    def __exit__(self, *exc):
        del self.server


# -- what rank 0 compares ----------------------------------------------------------------------

def test_only_the_parameters_of_ddp_modules_get_a_replica_checksum(monkeypatch, tmp_path):
    """A pipeline stage's own layers are not replicas: no checksum; a DDP module's are."""
    from graddoctor.instrument import Recorder
    from graddoctor.instrument.ddp import DDPWatcher, checksum_due
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
        rec = Recorder(step_budget=10)
        watcher = DDPWatcher(rec)
        stage = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(stage.parameters(), lr=0.1)
        watcher.after_step(0, opt)  # a pipeline stage: no DDP anywhere
        assert not rec.trace.of_kind("replica_checksum")
        ddp = DDP(torch.nn.Linear(4, 1))
        watcher._wrap_forward(DDP.forward)(ddp, torch.randn(2, 4))
        both = torch.optim.SGD([*stage.parameters(), *ddp.parameters()], lr=0.1)
        watcher.after_step(1, both)
        [event] = rec.trace.of_kind("replica_checksum")
        assert event["params"] == 2  # the DDP module's weight and bias, not the stage's
    finally:
        dist.destroy_process_group()
    # a divergence that starts after the first steps is still compared, at a log cost
    assert [n for n in range(1, 40) if checksum_due(n, 10)] == [1, 2, 3, 4, 8, 10, 16, 32]


def test_a_rank_whose_peer_stopped_at_the_budget_did_not_crash():
    echo = {"type": "RuntimeError", "location": None,
            "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:4"}
    settled = settled_at_budget(_report("crashed", steps=10, error=echo))
    assert settled.run.status == "step-limit" and settled.run.error is None
    assert "a peer had stopped at the same budget" in settled.run.notes[-1]
    early = _report("crashed", steps=4, error=echo)  # before the budget: a real failure
    assert settled_at_budget(early) is early
    own = _report("crashed", steps=10, error={"type": "ValueError", "message": "bad", "location": None})
    assert settled_at_budget(own) is own


class _Given(Exchange):
    """An exchange whose other ranks' reports are given (collect without processes)."""

    def __init__(self, env, reports):
        super().__init__(env)
        self.given = reports

    def collect(self, wait_s, files=None):
        return dict(self.given), {}


def _diverging(rank, value, path, line):
    return _report(checksums=[{"opt": 0, "step": 1, "value": value, "path": path, "line": line}])


def test_gd403_honours_ignore_select_and_inline_suppressions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("opt.step()\nopt.step()  # graddoctor: ignore[replicas-diverge]\n")
    env = RankEnv(0, 2, None, "p")
    for line, options, expected in ((1, _options(), ["replicas-diverge"]),
                                    (1, _options(ignore=("replicas-diverge",)), []),
                                    (1, _options(select=("missing-zero-grad",)), []),
                                    (2, _options(), [])):
        own = replace(_diverging(0, 1.0, str(script), line), base_dir=str(tmp_path))
        other = single(_diverging(1, 2.0, str(script), line), 1, "rank 1", 2, 2)
        merged = gather(_Given(env, {1: other}), own, options, wait_s=0)
        assert [f.rule for f in merged.active()] == expected, (line, options)


# -- stale files, run ids -----------------------------------------------------------------------

def test_rank_zero_merges_only_its_own_runs_files(tmp_path):
    env = RankEnv(0, 3, None, "p", "slurm:7.0")
    mine = RankEnv(1, 3, None, "p", "slurm:7.0")

    def write(rank, report, env_of, when=None):
        path = tmp_path / f"r.rank{rank}.json"
        path.write_text(render(rank_report(report, env_of)))
        if when is not None:
            os.utime(path, (when, when))
        return str(path)

    files = {r: str(tmp_path / f"r.rank{r}.json") for r in range(3)}
    write(1, _report(script="other.py"), mine)  # another script (no run id where it ran)
    write(2, _report(findings=[Finding("missing-zero-grad", "GD101", Severity.ERROR, "m",
                                       Location("train.py", 3))]),
          RankEnv(2, 3, None, "p", "slurm:6.0"))  # the same script, an earlier job
    exchange = Exchange(env)
    exchange.script = ("train.py", [])
    got, why = exchange.collect(0.3, files)
    assert got == {} and sorted(why) == [1, 2]
    assert "another command (other.py)" in why[1] and "another run (slurm:6.0)" in why[2]
    write(1, _report(), RankEnv(1, 3, None, "p", None), when=time.time() - 3600)  # old, no id
    assert "before this run started" in exchange.collect(0.3, files)[1][1]
    write(1, _report(), mine)
    write(2, _report(), RankEnv(2, 3, None, "p", "slurm:7.0"))
    got, why = exchange.collect(5, files)
    assert sorted(got) == [1, 2] and not why
    merged = gather(exchange, _report(), _options(), wait_s=5, files=files)
    assert merged.run.run_id == "slurm:7.0" and not merged.findings
    validate(to_dict(merged))


def test_the_run_id_comes_from_the_launcher():
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc",
                "TORCHELASTIC_RESTART_COUNT": "1"}
    assert rank_env(torchrun).run_id == "torchrun:abc/1"
    assert rank_env({**torchrun, "TORCHELASTIC_RUN_ID": "none"}).run_id is None  # the default
    assert rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "3",
                     "SLURM_JOB_ID": "99"}).run_id == "slurm:99.3"


# -- liveness ---------------------------------------------------------------------------------------

def test_a_rank_gone_without_a_report_is_missing_within_seconds_with_its_exit():
    with _Store() as store:
        gone = subprocess.Popen([sys.executable, "-c", "import os; os._exit(3)"])
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            # ranks 1 and 2 registered at their start; rank 2's process ended (reaped), rank 3
            # was SIGKILLed (its launcher posted the exit code), rank 4 sent its report
            for rank, pid in ((1, alive.pid), (2, gone.pid)):
                Exchange(store.env(rank, 5)).register()
                Exchange(store.env(rank, 5)).append_log("alive", f"{rank} {os.uname().nodename} {pid} -")
            gone.wait()
            Exchange(store.env(3, 5)).post_exit(3, -signal.SIGKILL)
            Exchange(store.env(4, 5)).send(render(rank_report(_report(), store.env(4, 5))))
            exchange = Exchange(store.env(0, 5))
            exchange.script = ("train.py", [])
            got, why = exchange.collect(4.0, None)
            assert sorted(got) == [4]
            assert "was killed by SIGKILL" in why[3]
            assert "before it reported" in why[2]
            assert "no report within 4 s" in why[1]  # alive: waited for, as long as allowed
            # rank 0's store traffic: a few requests a poll, never one per rank per poll
            assert exchange.requests < 4 * (4.0 / 0.1)
        finally:
            alive.kill()
            alive.wait()


def test_exit_statuses_read_as_the_report_says_them():
    assert describe_exit(-9).startswith("was killed by SIGKILL (killed from outside")
    assert describe_exit(0).startswith("exited with code 0")
    assert describe_exit(3) == "exited with code 3"


def test_missing_ranks_make_one_note_per_reason():
    missing = [missing_entry(r, f"rank {r}", "no report: the launcher ended the run")
               for r in range(1, 100)]
    merged = merge([Part(_report(), 0, "rank 0")], world_size=100, missing=missing)
    assert merged.run.notes == ["rank 2–99: no report: the launcher ended the run"]  # 1 leads
    missing.append(missing_entry(100, "rank 100", "no report: the rank was killed by SIGKILL"))
    merged = merge([Part(_report(), 0, "rank 0")], world_size=101, missing=missing)
    # the rank that died leads; the ranks the launcher then stopped: one note
    assert merged.run.error["message"] == "rank 100: no report: the rank was killed by SIGKILL"
    assert merged.run.notes == ["rank 1–99: no report: the launcher ended the run"]


# -- graddoctor merge -----------------------------------------------------------------------------

def _rank_file(tmp_path, rank, world=2, script="train.py", run_id="torchrun:x/0", name=None):
    env = RankEnv(rank, world, None, "p", run_id)
    path = tmp_path / (name or f"gd.{rank}.json")
    path.write_text(render(rank_report(_report(script=script), env)))
    return str(path)


def test_merge_refuses_other_runs_and_a_rank_twice_and_survives_a_corrupt_file(tmp_path):
    r0, r1 = _rank_file(tmp_path, 0), _rank_file(tmp_path, 1)
    other = _rank_file(tmp_path, 1, script="other.py", name="other.1.json")
    done = run_cli("merge", r0, other)
    assert done.returncode == 2 and "different runs" in done.stderr and "other.py" in done.stderr
    done = run_cli("merge", r0, r1, "-o", str(tmp_path / "gd.all.json"), "--format", "json")
    assert done.returncode == 0, done.stderr
    # merge's own output in the glob: left out, not 4 ranks for a world of 2
    again = run_cli("merge", *sorted(map(str, tmp_path.glob("gd.*.json"))), "--format", "json")
    data = json.loads(again.stdout)
    assert again.returncode == 0 and len(data["run"]["ranks"]) == 2, again.stdout
    assert any("merged before" in n for n in data["run"]["notes"])
    twice = _rank_file(tmp_path, 1, name="copy.json")
    done = run_cli("merge", r0, r1, twice)
    assert done.returncode == 2 and "rank 1 is given twice" in done.stderr
    (tmp_path / "gd.1.json").write_text('{"schema_version": 1, "run": {"scr')  # cut off
    done = run_cli("merge", r0, r1, "--format", "json")
    data = json.loads(done.stdout)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert [(e["rank"], e["status"]) for e in data["run"]["ranks"]] == [(0, "step-limit"),
                                                                         (1, "missing")]
    assert "unreadable report file" in data["run"]["ranks"][1]["error"]["message"]


# -- real launches ----------------------------------------------------------------------------------

def test_nproc_per_node_1_launches_through_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\nassert os.environ['RANK'] == '0' and 'MASTER_ADDR' in os.environ\n"
                      "import torch\nw = torch.nn.Parameter(torch.ones(2))\n"
                      "opt = torch.optim.SGD([w], lr=0.1)\nfor _ in range(3):\n"
                      "    opt.zero_grad()\n    w.sum().backward()\n    opt.step()\n")
    # the launcher forked warm (conftest.run_cli); torchrun starts the rank fresh
    done = run_cli("check", "--nproc-per-node", "1", "--format", "json", str(script), timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["run"]["status"] == "completed"


def test_sigterm_to_the_launcher_leaves_every_ranks_report_and_the_incomplete_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "w = torch.nn.Parameter(torch.ones(2))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(2):\n    opt.zero_grad()\n    w.sum().backward()\n    opt.step()\n"
        "dist.barrier()\nprint('TRAINED', file=sys.stderr, flush=True)\ntime.sleep(300)\n")
    out = tmp_path / "report.json"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "graddoctor", "check", "--nproc-per-node", "2", "--format",
         "json", "-o", str(out), str(script)], cwd=ROOT, env=cli_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in launcher.stderr:  # both ranks trained (the barrier) and sleep
            if "TRAINED" in line:
                break
        time.sleep(1.0)
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 2, err[-2000:]
    assert "Traceback" not in err and "the run was stopped (SIGTERM" in err
    data = json.loads(out.read_text())
    assert [(e["rank"], e["status"], e["steps"]) for e in data["run"]["ranks"]] == \
        [(0, "crashed", 2), (1, "crashed", 2)]
    assert data["run"]["error"]["type"] == "Terminated"


def test_a_rank_stuck_after_its_report_is_not_waited_for(tmp_path):
    """Both ranks' interpreter teardown never ends (as in a process group's destructor waiting
    for the GIL): rank 0 has rank 1's report, writes the run's, and the run ends by it."""
    script = tmp_path / "train.py"
    script.write_text(
        "import atexit, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "atexit.register(time.sleep, 3600)\n"
        "w = torch.nn.Parameter(torch.ones(2))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(2):\n    opt.zero_grad()\n    w.sum().backward()\n    opt.step()\n"
        "dist.destroy_process_group()\n")
    done = run_cli("check", "--nproc-per-node", "2", "--format", "json", str(script),
                   timeout=400, GRADDOCTOR_TEARDOWN_GRACE_S="2")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert [(e["rank"], e["status"]) for e in data["run"]["ranks"]] == [(0, "completed"),
                                                                         (1, "completed")]
    assert "rank 0 ended before" not in done.stderr


def test_a_rank_reports_at_destroy_process_group_before_its_teardown(tmp_path):
    """The report handed over at ``destroy_process_group()`` holds the whole training, names
    included, whatever the teardown after it does (here: a crash)."""
    from graddoctor.run.session import run_check

    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, world_size=1)\n"
        "def main():\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for _ in range(3):\n"
        "        model(torch.ones(1, 2)).sum().backward()\n"
        "        opt.step()\n"
        "    dist.destroy_process_group()\n"
        "    raise RuntimeError('teardown went wrong')\n"
        "main()\n")
    seen = []

    def on_destroy(report, destroy):
        seen.append(report)
        destroy()
        destroy()  # once only

    final = run_check(CheckOptions(target=str(script), steps=0), on_destroy=on_destroy)
    [early] = seen
    assert early.run.status == "completed" and early.run.steps == 3
    assert [f.rule for f in early.findings] == ["missing-zero-grad"]
    assert "model.weight" in early.findings[0].message  # main()'s locals name the parameters
    assert final.run.status == "crashed"  # the teardown's own end: not in the early report
    assert not dist.is_initialized()
