"""Long runs under graddoctor: what ``-o`` costs, and how memory grows with the number of steps.

    python benchmarks/long_run.py              # 20,000 tiny steps; a few minutes on 2 cores
    python benchmarks/long_run.py --quick      # 5,000 steps

Plain Python, no pytest; the repository root is put on sys.path of every child.

``-o``
    ``graddoctor check --steps 0 train.py`` and the same with ``-o report.json`` (then again
    with ``--steps N``, where a provisional report is due after every step), on a tiny MLP
    (three tensors, SGD) for N steps, run alternately (plain, -o, plain, -o ...), each in a
    fresh process. Prints both times (wall, and CPU time of the child: user + sys, the figure
    to trust on a shared machine) and their ratio. Target: -o within 1.5x.

Trace memory
    The peak RSS of ``graddoctor check --steps 0`` on the same script for a short and a long
    run, with folding on (as shipped) and off (``fold.FOLD_AFTER`` set past the run: every
    event kept), and the growth per step between the two. Target: bounded (a few
    bytes per step, noise), against ~2 KB per step without folding.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_root = ROOT  # the graddoctor checkout measured (--root)

SCRIPT = """\
import sys, torch
torch.manual_seed(0)
n = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.randn(4, 1)
for i in range(n):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
"""

# the child: graddoctor's CLI in-process, optionally with folding off; prints its peak RSS
CHILD = """\
import resource, sys
sys.path.insert(0, {root!r})
if {no_fold}:
    try:
        from graddoctor.instrument import fold
        fold.FOLD_AFTER = 10 ** 12
    except ImportError:  # a graddoctor from before folding (--root)
        pass
from graddoctor.cli import main
sys.argv = ["graddoctor", *{argv!r}]
try:
    main()
except SystemExit:
    pass
finally:
    print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def run_check(script: str, steps: int, *, output: str | None = None, no_fold: bool = False,
              budget: bool = False):
    """(wall s, cpu s, peak RSS KB) of one ``graddoctor check`` in a fresh process
    (``--steps 0``, or ``--steps N`` with ``budget``: a provisional report after every step)."""
    argv = ["check", script, "--steps", str(steps) if budget else "0", "--timeout", "0"]
    if output:
        argv += ["-f", "json", "-o", output]
    argv += ["--", str(steps)]
    code = CHILD.format(root=str(_root), no_fold=no_fold, argv=argv)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(_root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = [int(line.split()[1]) for line in result.stderr.splitlines() if line.startswith("MAXRSS_KB")]
    if result.returncode not in (0, 1) or not rss:
        sys.exit(f"graddoctor check failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return wall, cpu, rss[0]


def bench_output(script: str, steps: int, rounds: int, folder: str, budget: bool) -> None:
    flag = f"--steps {steps}" if budget else "--steps 0"
    print(f"-o on a long run: tiny MLP, {flag}, {steps} steps, {rounds} rounds (alternating)")
    plain, with_o = [], []
    for i in range(rounds):
        plain.append(run_check(script, steps, budget=budget))
        with_o.append(run_check(script, steps, output=os.path.join(folder, f"r{i}.json"),
                                budget=budget))
        print(f"  round {i + 1}: plain {plain[-1][0]:.1f} s wall / {plain[-1][1]:.1f} s cpu;"
              f"  -o {with_o[-1][0]:.1f} s wall / {with_o[-1][1]:.1f} s cpu", flush=True)
    for name, index in (("wall", 0), ("cpu", 1)):
        p = statistics.median(r[index] for r in plain)
        o = statistics.median(r[index] for r in with_o)
        print(f"  median {name:4}: without -o {p:6.1f} s   with -o {o:6.1f} s   ratio {o / p:.2f}"
              f"   (target <= 1.5)")


def bench_memory(script: str, short: int, long: int) -> None:
    print(f"peak RSS of graddoctor check --steps 0, {short} vs {long} steps")
    for label, no_fold in (("before (every event kept)", True), ("after (repeated turns folded)", False)):
        a = run_check(script, short, no_fold=no_fold)[2]
        b = run_check(script, long, no_fold=no_fold)[2]
        per_step = (b - a) * 1024 / (long - short)
        print(f"  {label:30}: {a / 1024:7.1f} MB -> {b / 1024:7.1f} MB   "
              f"growth {per_step:8.1f} bytes/step", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5,000 steps, one round")
    p.add_argument("--steps", type=int, default=0, help="steps of the long run (default 20,000)")
    p.add_argument("--rounds", type=int, default=0, help="alternating rounds of the -o benchmark")
    p.add_argument("--only", default="output,budget,memory",
                   help="comma-separated: output (--steps 0), budget (--steps N), memory")
    p.add_argument("--root", default=str(ROOT),
                   help="the graddoctor checkout to measure (default: this one), for before/after")
    args = p.parse_args()
    global _root
    _root = Path(args.root).resolve()
    print(f"graddoctor from {_root}")
    steps = args.steps or (5000 if args.quick else 20000)
    rounds = args.rounds or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        if "output" in args.only:
            bench_output(script, steps, rounds, folder, budget=False)
        if "budget" in args.only:
            bench_output(script, steps, rounds, folder, budget=True)
        if "memory" in args.only:
            bench_memory(script, max(1, steps // 10), steps)


if __name__ == "__main__":
    main()
