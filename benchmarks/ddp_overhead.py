"""graddoctor's per-step overhead under DistributedDataParallel (2 gloo ranks on CPU), next to
the single-process overhead of the same workloads measured in the same processes.

    python benchmarks/ddp_overhead.py                 # launches 2 ranks via torch.distributed.run
    python benchmarks/ddp_overhead.py --rounds 20     # fewer rounds (a smoke run)

Same method as benchmarks/overhead.py (whose sessions, ``suspended()`` and statistics it
reuses): the instrumentation is installed once per arm and toggled; an instrumented session (I,
built under it, like a script under ``graddoctor check``) and a plain one (P) take one step each
per round, in alternating order, and the ratio I/P of this thread's CPU time is taken per round
(median, interquartile range). Both ranks run the same sequence, so their DDP all-reduces pair
up; the single-process arms (no DDP) run right after, in the same ranks, on the same loaded
machine. Rank 0 prints both tables. Targets as for one process: MLP <= 1.15, transformer <= 1.05.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=0, help="rounds per workload (default: "
                        "60 for the MLP, 16 for the transformer)")
    parser.add_argument("--only", default="mlp,transformer")
    return parser.parse_args(argv)


def measure(builder, rounds: int, warmup: int, ddp: bool) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import overhead as O

    def build():
        session = builder()
        if ddp:
            session.model = DDP(session.model)
        return session

    plain = build()
    rec = O.Recorder(step_budget=None, finder=O.LocationFinder())
    instrumentation = O.Instrumentation(rec)
    samples = {"I": [], "P": []}
    with instrumentation:
        instr = build()
        for _ in range(warmup):
            instr.step()
        with O.suspended(instrumentation):
            for _ in range(warmup):
                plain.step()
        for r in range(rounds):
            for arm in (("I", "P") if r % 2 == 0 else ("P", "I")):
                if arm == "I":
                    samples["I"].append(O._timed(instr.step))
                else:
                    with O.suspended(instrumentation):
                        samples["P"].append(O._timed(plain.step))
    del torch
    ratios = [i[1] / p[1] for i, p in zip(samples["I"], samples["P"])]
    return {"plain_ms": 1e3 * statistics.median(p[1] for p in samples["P"]),
            "wall_ms": 1e3 * statistics.median(p[0] for p in samples["P"]),
            "ratio": O.quartiles(ratios)}


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import overhead as O

    workloads = {"mlp": (O.build_mlp, 60, 10, 1.15), "transformer": (O.build_transformer, 16, 3, 1.05)}
    rows = []
    for name in args.only.split(","):
        builder, rounds, warmup, target = workloads[name]
        rounds = args.rounds or rounds
        for ddp in (True, False):
            row = measure(builder, rounds, warmup, ddp)
            rows.append((name, "DDP, 2 ranks" if ddp else "single process", rounds, target, row))
            dist.barrier()
    if dist.get_rank() == 0:
        print(f"{'workload':<12} {'arm':<15} {'rounds':>6} {'plain step (cpu)':>17} "
              f"{'ratio I/P (cpu) median [q1, q3]':>34} {'target':>7}")
        for name, arm, rounds, target, row in rows:
            q1, q2, q3 = row["ratio"]
            print(f"{name:<12} {arm:<15} {rounds:>6} {row['plain_ms']:>14.2f} ms "
                  f"{q2:>19.3f} [{q1:.3f}, {q3:.3f}] {'<= ' + str(target):>8}"
                  f" {'ok' if q2 <= target else 'OVER'}")
    dist.destroy_process_group()


def main() -> int:
    args = _args()
    if "RANK" in os.environ:
        rank_main(args)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "2", __file__, *sys.argv[1:]], env=env)


if __name__ == "__main__":
    sys.exit(main())
