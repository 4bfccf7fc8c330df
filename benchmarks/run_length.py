"""graddoctor's cost against the length of the run: many short steps.

    python benchmarks/run_length.py              # 1,000, 10,000, 100,000 steps
    python benchmarks/run_length.py --quick      # 1,000 and 10,000 steps, one round
    python benchmarks/run_length.py --steps 20000 --rounds 3
    python benchmarks/run_length.py --steps 20000 --rounds 3 --against /tmp/old-checkout

Plain Python, no pytest; the repository root is put on each child's sys.path.

The script is a tiny MLP (four tensors, SGD; ``benchmarks/long_run.py``'s) run for N steps,
each in a fresh process, three ways side by side in each round (their order rotating between
rounds): ``python train.py`` (plain), ``graddoctor check --steps 0 train.py`` (the whole run
replayed under graddoctor), and the same with ``-o report.html`` (every update's gradient
norms recorded for the picture, the page written at the end). A short step is where
graddoctor's per-event work (the location of each call, folding, the events themselves) weighs
the most. Shown: the CPU time of each child (user + sys, the figure to trust on a shared
machine; start-up and the report included), the ratios to plain (median of the rounds), and
the peak RSS of each arm: folding keeps the trace bounded, so the peak must stay flat from
10,000 to 100,000 steps.

``--against DIR`` adds the two check arms once more with the graddoctor of another checkout (its
root, e.g. ``git worktree add /tmp/old main``), in the same rounds and rotation: on a shared
machine, whose load moves every ratio by several percent from one run to the next, a before/after
comparison is only fair side by side.

graddoctor's modules (and the other checkout's) are byte-compiled before the first round, as
``pip install`` leaves them: where ``PYTHONDONTWRITEBYTECODE`` is set (the development machine sets
it) an editable checkout has no ``__pycache__`` and every fresh process would compile its 260
modules from source (about 0.35 s of CPU per start, 5% of a 20,000-step run), a cost no installed
copy pays. ``--from-source`` measures that way instead.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_run import SCRIPT  # noqa: E402

# one child: the script under ``python`` (argv[0] "plain") or the CLI in-process; its peak RSS
CHILD = """\
import resource, runpy, sys
sys.path.insert(0, {root!r})
argv = {argv!r}
try:
    if argv[0] == "plain":
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
    else:
        from graddoctor.cli import main
        sys.argv = ["graddoctor", *argv]
        main()
except SystemExit:
    pass
finally:
    print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def child(argv: list[str], root: Path = ROOT) -> tuple[float, int]:
    """(CPU seconds, peak RSS KB) of one fresh process running ``argv`` with the graddoctor
    of checkout ``root``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(root), argv=argv)],
                          capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("MAXRSS_KB")]
    if done.returncode not in (0, 1) or not rss:
        sys.exit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), rss[0]


CHECKS = ("check", "check -o html")


def byte_compile(root: Path) -> None:
    """Write the ``__pycache__`` of checkout ``root``'s graddoctor, as an installation has it."""
    if not compileall.compile_dir(str(root / "graddoctor"), quiet=1):
        sys.exit(f"could not byte-compile {root / 'graddoctor'}")


def measure(script: str, steps: int, rounds: int, folder: str, against: Path | None = None) -> dict:
    arms = {
        "plain": ["plain", script, str(steps)],
        "check": ["check", script, "--steps", "0", "--timeout", "0", "--", str(steps)],
        "check -o html": ["check", script, "--steps", "0", "--timeout", "0",
                          "-o", os.path.join(folder, "report.html"), "--", str(steps)],
    }
    roots = dict.fromkeys(arms, ROOT)
    if against is not None:  # the same check arms with the other checkout's graddoctor
        for arm in CHECKS:
            arms[f"{arm} (against)"] = [*arms[arm]]
            roots[f"{arm} (against)"] = against
    names = list(arms)
    # all orders for the three arms; with --against, every rotation of the five
    orders = (list(itertools.permutations(names)) if against is None
              else [names[r:] + names[:r] for r in range(len(names))])
    runs: dict[str, list[tuple[float, int]]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in orders[r % len(orders)]:
            runs[arm].append(child(arms[arm], roots[arm]))
    out = {}
    for arm, samples in runs.items():
        out[arm] = {"cpu_s": statistics.median(s[0] for s in samples),
                    "rss_mb": max(s[1] for s in samples) / 1024}
    for arm in names[1:]:
        out[arm]["ratio"] = statistics.median(
            s[0] / p[0] for s, p in zip(runs[arm], runs["plain"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1,000 and 10,000 steps, one round")
    p.add_argument("--steps", default="", help="comma-separated run lengths")
    p.add_argument("--rounds", type=int, default=0, help="rounds per length (default 3; 1 at 100k)")
    p.add_argument("--against", type=Path, default=None, metavar="DIR",
                   help="also run the check arms with the graddoctor of this checkout (A/B)")
    p.add_argument("--from-source", action="store_true",
                   help="do not byte-compile graddoctor first (with PYTHONDONTWRITEBYTECODE set, "
                        "every start then compiles it)")
    args = p.parse_args()
    if not args.from_source:
        for root in (ROOT, args.against):
            if root is not None:
                byte_compile(root)
    lengths = ([int(s) for s in args.steps.split(",")] if args.steps
               else [1000, 10000] if args.quick else [1000, 10000, 100000])
    print(f"{'steps':>7} {'plain cpu s':>11} {'check':>7} {'check -o html':>14}"
          f" {'RSS MB plain / check / -o':>28}")
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        for steps in lengths:
            rounds = args.rounds or (1 if args.quick or steps >= 100000 else 3)
            row = measure(script, steps, rounds, folder, args.against)
            rss = " / ".join(f"{row[arm]['rss_mb']:.0f}" for arm in ("plain", *CHECKS))
            print(f"{steps:>7} {row['plain']['cpu_s']:>11.1f} {row['check']['ratio']:>7.2f}"
                  f" {row['check -o html']['ratio']:>14.2f} {rss:>28}", flush=True)
            if args.against is not None:
                rss = " / ".join(f"{row[f'{arm} (against)']['rss_mb']:.0f}" for arm in CHECKS)
                print(f"{'against':>7} {'':>11} {row['check (against)']['ratio']:>7.2f}"
                      f" {row['check -o html (against)']['ratio']:>14.2f} {rss:>28}", flush=True)


if __name__ == "__main__":
    main()
