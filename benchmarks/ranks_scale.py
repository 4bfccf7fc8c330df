"""1,000 ranks through graddoctor's real collect and merge code (run/ranks.py, report/merge.py),
on loopback, in one process: a ``TCPStore`` as torchrun's agent store, synthetic rank reports
sent by a thread as the ranks would (each through ``Exchange.send``), rank 0's ``gather``
collecting and merging them. Prints:

* the time from the last rank's report to rank 0's merged report (rendered as JSON);
* rank 0's store requests (it polls one counter and reads new reports in batches);
* a rank's report size, with its parameter lists as the rules write them and as sent (bounded);
* how long rank 0 takes to see dead ranks (10 ranks SIGKILLed: their exit posted by the
  launcher; 10 gone on this host: registered pids that no longer run) — not the full wait;
* the merge of 16,000 rank-unique notes.

    python benchmarks/ranks_scale.py [--ranks 1000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch.distributed as dist  # noqa: E402

from graddoctor.findings import Finding, Severity  # noqa: E402
from graddoctor.options import CheckOptions  # noqa: E402
from graddoctor.report.json_format import render  # noqa: E402
from graddoctor.report.merge import Part, merge  # noqa: E402
from graddoctor.report.model import Report, RunInfo  # noqa: E402
from graddoctor.run.ranks import Exchange, RankEnv, gather, rank_report  # noqa: E402
from graddoctor.trace import Location  # noqa: E402

TENSORS = 600  # parameter names each finding lists (a mid-size transformer)


def synthetic(rank: int) -> Report:
    names = [f"model.layers.{i // 6}.block.weight_{i % 6}" for i in range(TENSORS)]
    findings = [Finding("missing-zero-grad", "GD101", Severity.ERROR, "gradients accumulate",
                        Location("train.py", 40), fix="call zero_grad", step=2,
                        evidence={"params": names}),
                Finding("frozen-param-updated", "GD104", Severity.WARNING, "frozen updated",
                        Location("train.py", 52), fix="filter", step=3,
                        evidence={"params": names})]
    run = RunInfo(script="train.py", argv=["--lr", "0.1"], status="step-limit", steps=10,
                  backward_calls=10, step_budget=10, torch_version="2.13.0+cpu",
                  notes=[f"rank-local data shard {rank}"],
                  checksums=[{"opt": 0, "step": s, "value": 1.5 * s, "path": "train.py",
                              "line": 41} for s in (1, 2, 3, 4, 8, 10)])
    return Report(run=run, findings=findings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1000)
    n = parser.parse_args().ranks
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=30))

    def env(rank, prefix):
        return RankEnv(rank, n, ("127.0.0.1", server.port), prefix, "bench")

    raw = len(render(synthetic(1)))
    sent_size = len(render(rank_report(synthetic(1), env(1, "x"))))
    texts = {r: render(rank_report(synthetic(r), env(r, "a"))) for r in range(1, n)}

    # 1. every rank reports (spread over half a second); rank 0 collects and merges
    last = []

    def ranks(prefix, skip=()):
        for r in range(1, n):
            if r in skip:
                continue
            sender = Exchange(env(r, prefix))
            sender._store = client  # one connection stands for the ranks' own
            sender.send(texts[r])
            if r % 100 == 0:
                time.sleep(0.05)
        last.append(time.perf_counter())

    thread = threading.Thread(target=ranks, args=("a",))
    rank0 = Exchange(env(0, "a"))
    thread.start()
    merged = gather(rank0, synthetic(0), CheckOptions(target="train.py", timeout=600.0))
    out = render(merged)
    done = time.perf_counter()
    thread.join()
    assert len(merged.run.ranks) == n and merged.run.status == "step-limit", merged.run.status
    print(f"{n} ranks: merged report {done - last[0]:.2f} s after the last rank's report "
          f"({len(out) / 1e6:.1f} MB JSON, {len(merged.findings)} findings, "
          f"{len(merged.run.notes)} notes)")
    print(f"rank 0's store requests: {rank0.requests} in all (one counter polled each "
          f"0.1 s, reports read {256} at a time)")
    print(f"a rank's report: {raw / 1e3:.1f} kB as the rules wrote it ({TENSORS} parameter "
          f"names per finding), {sent_size / 1e3:.1f} kB as sent; in the store "
          f"{sum(map(len, texts.values())) / 1e6:.1f} MB for {n - 1} ranks")

    # 2. 20 ranks dead without a report: 10 killed (the launcher posts their exit code),
    #    10 gone on this host (registered pids no longer running)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed, gone = set(range(1, 11)), set(range(11, 21))
    poster = Exchange(env(0, "b"))
    poster._store = client
    for r in gone:
        poster.append_log("alive", f"{r} {os.uname().nodename} {dead.pid} -")
    for r in killed:
        poster.post_exit(r, -9)
    thread = threading.Thread(target=ranks, args=("b", killed | gone))
    rank0 = Exchange(env(0, "b"))
    thread.start()
    merged = gather(rank0, synthetic(0), CheckOptions(target="train.py", timeout=600.0))
    done = time.perf_counter()
    thread.join()
    missing = [e for e in merged.run.ranks if e["status"] == "missing"]
    print(f"20 dead ranks among {n}: the merged report {done - last[-1]:.2f} s after the last "
          f"live rank's report ({len(missing)} missing; the wait allowed was "
          f"{600 + 60} s); {len(merged.run.notes)} notes: {merged.run.notes[-2:]}")

    # 3. the notes merge with rank-unique notes
    parts = [Part(synthetic(r), r, f"rank {r}") for r in range(16000)]
    start = time.perf_counter()
    merged = merge(parts, world_size=16000)
    print(f"merge of 16,000 ranks' reports with a note of their own each: "
          f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
