"""The per-step cost of ``graddoctor.watch()`` next to the CLI's, measured side by side.

    python benchmarks/watch_overhead.py            # mlp and transformer, ~1-2 minutes on 2 cores
    python benchmarks/watch_overhead.py --quick    # smoke run

Three arms run the same training steps (the workloads of benchmarks/overhead.py) in one
process, interleaved round by round in an order that rotates through all six permutations:

* plain   — no graddoctor;
* cli     — the steps are the body of a script run by ``graddoctor check`` in-process
            (``options.resolve`` + ``session.run_check``, what the CLI runs: the runner, the
            time limit, ``--steps 0`` so that the budget does not end it);
* watch   — the same steps inside ``with graddoctor.watch():``.

Each arm builds its model and optimizer inside its own run (as a script would), warms up, then
times single steps: the CPU time of this thread (``thread_time``; one torch thread, so the
whole CPU step runs here) and wall time. The table shows the median step of each arm and the
ratios; ``watch/cli`` is the figure that says whether ``watch()`` costs what the CLI costs
(1.00 = the same). Both arms install the same ``Instrumentation``; what differs is only how it
is entered.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import overhead  # noqa: E402  (the workloads; imported with its defaults)
import torch  # noqa: E402

import graddoctor  # noqa: E402
from graddoctor.options import resolve  # noqa: E402
from graddoctor.run.session import run_check  # noqa: E402

torch.set_num_threads(1)
sys.modules["graddoctor_watch_bench"] = sys.modules[__name__]  # the CLI arm's script imports us

SCRIPT = ("import graddoctor_watch_bench as bench\n"
          "bench.steps_of(bench.CURRENT['workload'], bench.CURRENT['out'])\n")
CURRENT: dict = {}
BUILDERS = {"mlp": overhead.build_mlp, "cnn": overhead.build_cnn,
            "transformer": overhead.build_transformer}
PLAN = {"mlp": (60, 10, 30), "cnn": (30, 3, 8), "transformer": (12, 2, 6)}  # steps, warm-up, rounds


def steps_of(workload: str, out: list) -> None:
    """Build the workload, warm up, then time single steps into ``out`` (wall, cpu)."""
    n, warmup, _ = PLAN[workload]
    if ARGS.quick:
        n = max(3, n // 4)
    session = BUILDERS[workload]()
    for _ in range(warmup):
        session.step()
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        session.step()
        out.append((time.perf_counter() - w0, time.thread_time() - c0))


def arm_plain(workload: str, out: list) -> None:
    steps_of(workload, out)


def arm_watch(workload: str, out: list) -> None:
    with graddoctor.watch() as w:
        steps_of(workload, out)
    assert w.report is not None and not w.report.internal_errors, w.report.internal_errors


def arm_cli(workload: str, out: list, script: str) -> None:
    CURRENT.update(workload=workload, out=out)
    options = resolve(script, (), {"steps": 0}, {"steps"}, source="library",
                      use_config=False).options
    report = run_check(options)
    assert report.run.status == "completed", report.run
    assert not report.internal_errors, report.internal_errors


def measure(workload: str, script: str) -> dict:
    rounds = PLAN[workload][2] if not ARGS.quick else 6
    rounds = ARGS.rounds or rounds
    samples: dict[str, list] = {"plain": [], "cli": [], "watch": []}
    per_round: list[tuple[float, float]] = []  # (watch/cli, cli/plain) on the cpu clock
    orders = list(itertools.permutations(samples))
    for r in range(rounds):
        got: dict[str, list] = {}
        for arm in orders[r % len(orders)]:
            out: list = []
            if arm == "plain":
                arm_plain(workload, out)
            elif arm == "watch":
                arm_watch(workload, out)
            else:
                arm_cli(workload, out, script)
            got[arm] = out
            samples[arm].extend(out)
        med = {arm: statistics.median(c for _, c in got[arm]) for arm in got}
        per_round.append((med["watch"] / med["cli"], med["cli"] / med["plain"]))
    row = {"workload": workload, "rounds": rounds}
    for clock, k in (("wall", 0), ("cpu", 1)):
        row[clock] = {arm: 1e3 * statistics.median(s[k] for s in samples[arm]) for arm in samples}
    ratios = [a for a, _ in per_round]
    row["watch_over_cli"] = statistics.median(ratios)
    row["watch_over_cli_iqr"] = (statistics.quantiles(ratios, n=4)[0],
                                 statistics.quantiles(ratios, n=4)[2]) if len(ratios) > 1 else \
        (ratios[0], ratios[0])
    return row


def main() -> None:
    workloads = [w for w in ARGS.only.split(",") if w]
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train_bench.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        rows = [measure(w, script) for w in workloads]
    print("\nper-step time, median (ms; cpu = this thread's CPU time, 1 torch thread)")
    print(f"{'workload':<12} {'clock':<5} {'plain':>9} {'cli':>9} {'watch':>9} "
          f"{'cli/plain':>10} {'watch/plain':>12} {'watch/cli':>10}")
    for row in rows:
        for clock in ("cpu", "wall"):
            t = row[clock]
            print(f"{row['workload']:<12} {clock:<5} {t['plain']:9.3f} {t['cli']:9.3f} "
                  f"{t['watch']:9.3f} {t['cli'] / t['plain']:10.3f} "
                  f"{t['watch'] / t['plain']:12.3f} {t['watch'] / t['cli']:10.3f}")
    print("\nwatch/cli per round (cpu clock): median [interquartile range]")
    for row in rows:
        lo, hi = row["watch_over_cli_iqr"]
        print(f"  {row['workload']:<12} {row['watch_over_cli']:.3f} [{lo:.3f}, {hi:.3f}]  "
              f"({row['rounds']} rounds)")


def _parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run")
    p.add_argument("--only", default="mlp,transformer", help="comma-separated: mlp,cnn,transformer")
    p.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    return p.parse_args()


ARGS = _parse_args() if __name__ == "__main__" else argparse.Namespace(quick=True, only="mlp",
                                                                         rounds=0)

if __name__ == "__main__":
    main()
