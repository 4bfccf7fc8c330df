"""The teardown deadlock, measured: a clean 2-rank DDP script with ``main()`` that calls
``destroy_process_group()`` and returns (its DDP model and process group are freed as main
returns), checked full length with ``graddoctor check --nproc-per-node 2`` RUNS times with fixed
seeds. A run "hangs" when it does not end within ``--limit`` seconds (its ``--timeout`` is below
that) or ends incomplete. Prints the hang rate; compare branches with PYTHONPATH.

    python benchmarks/teardown_stress.py --runs 12
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SCRIPT = '''
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(seed):
    dist.init_process_group("gloo")
    torch.manual_seed(seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(40):
        opt.zero_grad()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--limit", type=float, default=120.0)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="gd-teardown-")
    path = os.path.join(folder, "train.py")
    with open(path, "w") as f:
        f.write(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    hangs, times = 0, []
    for seed in range(args.runs):
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "graddoctor", "check", "--nproc-per-node", "2", "--steps",
                 "0", "--timeout", str(int(args.limit * 0.6)), "--format", "json", path,
                 "--", str(seed)], env=env, capture_output=True, text=True, timeout=args.limit)
            status = json.loads(done.stdout)["run"]["status"] if done.stdout.strip() else "?"
            hung = done.returncode != 0 or status != "completed"
        except subprocess.TimeoutExpired:
            hung, status = True, "killed at the limit"
        times.append(time.perf_counter() - start)
        hangs += hung
        print(f"seed {seed}: {status} in {times[-1]:.1f} s{'  <- HANG' if hung else ''}", flush=True)
    print(f"{hangs}/{args.runs} runs hung or ended incomplete; median run "
          f"{sorted(times)[len(times) // 2]:.1f} s")


if __name__ == "__main__":
    main()
