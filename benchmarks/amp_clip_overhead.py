"""Per-step cost of the AMP / clipping / scheduler / DataLoader watchers, instrumented vs plain.

    OMP_NUM_THREADS=1 python benchmarks/amp_clip_overhead.py [--rounds 5] [--steps 40]

One process, the same seeded loop (bf16 autocast, GradScaler("cpu"), accumulation over 2
micro-batches, unscale_ + clip_grad_norm_, OneCycleLR, a DataLoader) run alternately plain and
under ``Instrumentation`` (real epoch length, so both do the same work). Prints the median
time per optimizer step of each and their ratio, measured from the third step on: the first
step pays one-off costs (graddoctor names the parameters there with one ``gc`` scan).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402


def loop(steps: int) -> float:
    """Seconds per optimizer step after the first two."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))  # ~1.3M parameters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps + 1)
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(TensorDataset(torch.randn(64 * 2 * steps, 256), torch.randint(0, 10, (64 * 2 * steps,))),
                        batch_size=64)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y) / 2
        scaler.scale(loss).backward()
        if (i + 1) % 2 == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad()
            if (i + 1) // 2 == 2:
                start = time.perf_counter()
    return (time.perf_counter() - start) / (steps - 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    plain, watched = [], []
    loop(4)  # warm-up
    for _ in range(args.rounds):
        plain.append(loop(args.steps))
        rec = Recorder(step_budget=None)
        with Instrumentation(rec, epoch_batches=0):
            watched.append(loop(args.steps))
        assert not rec.trace.of_kind("internal_error")
    p, w = statistics.median(plain), statistics.median(watched)
    print(f"plain {p * 1e3:.2f} ms/step, instrumented {w * 1e3:.2f} ms/step, ratio {w / p:.3f} "
          f"(rounds {args.rounds}, steps {args.steps}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
