"""graddoctor's Python work per turn of a long steady loop, counted in bytecodes.

    python benchmarks/turn_opcodes.py                 # this checkout
    python benchmarks/turn_opcodes.py --against DIR   # and another checkout's, side by side

Plain Python, no pytest. Timing a skimmed turn (≈ 100 µs over a ≈ 330 µs plain step on the
development machine) moves by ±10 µs from run to run on a loaded machine, more than a change to
one hook is worth; the number of Python bytecodes a turn executes does not move at all. This runs
``run_length.py``'s tiny MLP (four tensors, SGD) under ``graddoctor check --steps 0`` in a fresh
process, and from turn ``--at`` (past the skim's start, about turn 1,030) traces ``--turns``
turns with ``sys.settrace`` and ``f_trace_opcodes``, counting the opcodes run in graddoctor's
files only. Shown: the median turn (a skimmed one), the mean (the sampled turns included), and
the skimmed turns' opcodes by file. The same script run plain gives torch's own Python per turn
(about 2,075 opcodes) for scale.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """\
import collections, sys, torch
torch.manual_seed(0)
at, turns = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.randn(4, 1)
counts = collections.Counter()

def trace(frame, event, arg):
    name = frame.f_code.co_filename
    if "graddoctor" not in name.replace(sys.argv[0], ""):
        return None
    frame.f_trace_opcodes = True
    key = name.rsplit("/", 1)[-1]

    def local(frame, event, arg):
        if event == "opcode":
            counts[key] += 1
        return local
    return local

per_turn, skimmed = [], collections.Counter()
for i in range(at + turns):
    if i >= at:
        sys.settrace(trace)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sys.settrace(None)
    if i >= at:
        per_turn.append(sum(counts.values()))
        if per_turn[-1] < 1.5 * sorted(per_turn)[len(per_turn) // 2]:
            skimmed.update(counts)
        counts.clear()
n = sum(1 for t in per_turn if t < 1.5 * sorted(per_turn)[len(per_turn) // 2])
print("OPCODES", sorted(per_turn)[len(per_turn) // 2], sum(per_turn) / len(per_turn),
      ";".join(f"{k}={v / n:.0f}" for k, v in skimmed.most_common()), file=sys.stderr)
"""


def measure(root: Path, script: str, at: int, turns: int) -> tuple[int, float, list[tuple[str, int]]]:
    code = ("import sys\nsys.path.insert(0, {root!r})\nfrom graddoctor.cli import main\n"
            "sys.argv = ['graddoctor', 'check', '--steps', '0', '--timeout', '0', {script!r}, '--',"
            " {at!r}, {turns!r}]\ntry:\n    main()\nexcept SystemExit:\n    pass\n").format(
        root=str(root), script=script, at=str(at), turns=str(turns))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(root))
    line = next((ln for ln in done.stderr.splitlines() if ln.startswith("OPCODES")), None)
    if line is None:
        sys.exit(f"no count from {root}:\n{done.stderr[-3000:]}")
    _, median, mean, files = line.split(" ", 3)
    by_file = [(k, int(v)) for k, v in (item.split("=") for item in files.split(";"))]
    return int(median), float(mean), by_file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--at", type=int, default=3000, help="first traced turn (past the skim's start)")
    p.add_argument("--turns", type=int, default=64, help="turns traced")
    p.add_argument("--against", type=Path, default=None, metavar="DIR",
                   help="also count with the graddoctor of this checkout")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        for root in (ROOT, args.against):
            if root is None:
                continue
            median, mean, by_file = measure(root, script, args.at, args.turns)
            print(f"{root}: {median} opcodes per skimmed turn, {mean:.0f} on average")
            for name, count in by_file:
                print(f"  {count:>6} {name}")


if __name__ == "__main__":
    main()
