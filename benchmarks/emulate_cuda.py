"""What ``--emulate-cuda`` costs per training step: the GPU version of a step (``.cuda()`` on
the batch, ``torch.autocast("cuda")``, ``GradScaler("cuda")``) run under the emulation, against
the same step written for the CPU (the same math: CPU autocast in the same dtype, an enabled CPU
GradScaler), side by side in one run.

    python benchmarks/emulate_cuda.py            # a few minutes on 2 shared CPU cores
    python benchmarks/emulate_cuda.py --quick    # smoke run

Plain Python + torch (the repository root is put on sys.path). No graddoctor instrumentation in
either arm: the ratio is the emulation's own cost (the device rewrite, a ``TorchFunctionMode``
that every torch call made from Python goes through, and the copies ``.cuda()`` makes as a GPU
would); under ``graddoctor check`` the instrumentation's cost comes on top of both alike.

How the arms are interleaved: the emulation is entered and left around each emulated step,
outside the timed region (a few dozen setattr); each round times one step of each arm, in
alternating order, and gives one ratio emulated/CPU. An A/A pair (two CPU sessions) gives the
noise floor. Clock: the CPU time of this thread (one torch thread), which the time other
processes hold the core does not inflate; wall time is shown too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds per workload (default 300, quick 40)")
    p.add_argument("--only", default="", help="comma-separated workloads: mlp,cnn,transformer")
    return p.parse_args(argv)


def _workloads():
    import torch
    from torch import nn

    def mlp():
        model = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(64, 64), nn.ReLU())],
                              nn.Linear(64, 4))
        return model, (lambda: (torch.randn(32, 64), torch.randint(0, 4, (32,)))), \
            nn.functional.cross_entropy

    def cnn():
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
        return model, (lambda: (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))), \
            nn.functional.cross_entropy

    def transformer():
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(1000, 128)
                layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True, dropout=0.1)
                self.encoder = nn.TransformerEncoder(layer, 2)
                self.head = nn.Linear(128, 1000)

            def forward(self, tokens):
                return self.head(self.encoder(self.embed(tokens))).flatten(0, 1)

        return LM(), (lambda: (torch.randint(0, 1000, (8, 32)), torch.randint(0, 1000, (256,)))), \
            nn.functional.cross_entropy

    return {"mlp": mlp, "cnn": cnn, "transformer": transformer}


class Session:
    """One arm: a model, its optimizer and scaler, and its step (``gpu``: written for CUDA)."""

    def __init__(self, build, gpu: bool, dtype):
        import copy

        import torch

        model, self.batch, self.loss_fn = build()
        self.gpu = gpu
        self.dtype = dtype
        self.model = copy.deepcopy(model)
        if gpu:
            self.model = self.model.cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler("cuda" if gpu else "cpu")

    def step(self, x, y) -> None:
        import torch

        if self.gpu:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda" if self.gpu else "cpu", dtype=self.dtype):
            loss = self.loss_fn(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()


def _measure(name: str, build, rounds: int, warmup: int) -> dict:
    import torch

    from graddoctor.run.emulate_cuda import CudaEmulation, _cpu_autocast_dtypes

    dtype = torch.float16 if torch.float16 in _cpu_autocast_dtypes() else torch.bfloat16
    torch.manual_seed(0)
    emulation = CudaEmulation()
    plain, plain2 = Session(build, False, dtype), Session(build, False, dtype)
    with emulation:
        emulated = Session(build, True, dtype)
    arms = {"emulated": emulated, "cpu": plain, "cpu2": plain2}
    cpu_times = {k: [] for k in arms}
    wall_times = {k: [] for k in arms}
    orders = [("emulated", "cpu", "cpu2"), ("cpu", "cpu2", "emulated"), ("cpu2", "emulated", "cpu")]
    for r in range(warmup + rounds):
        x, y = emulated.batch()
        for arm in orders[r % len(orders)]:
            session = arms[arm]
            if arm == "emulated":
                emulation.__enter__()
            try:
                c0, w0 = time.thread_time(), time.perf_counter()
                session.step(x, y)
                c1, w1 = time.thread_time(), time.perf_counter()
            finally:
                if arm == "emulated":
                    emulation.__exit__(None, None, None)
            if r >= warmup:
                cpu_times[arm].append(c1 - c0)
                wall_times[arm].append(w1 - w0)

    def ratios(times, a, b):
        return sorted(x / y for x, y in zip(times[a], times[b]) if y > 0)

    def summary(values):
        q = statistics.quantiles(values, n=4)
        return statistics.median(values), q[0], q[2]

    return {
        "workload": name, "dtype": str(dtype).replace("torch.", ""), "rounds": rounds,
        "cpu_step_ms": statistics.median(cpu_times["cpu"]) * 1000,
        "emulated_step_ms": statistics.median(cpu_times["emulated"]) * 1000,
        "ratio": summary(ratios(cpu_times, "emulated", "cpu")),
        "aa": summary(ratios(cpu_times, "cpu2", "cpu")),
        "wall_ratio": summary(ratios(wall_times, "emulated", "cpu")),
    }


def main(argv=None) -> int:
    args = _parse_args(argv)
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    rounds = args.rounds or (40 if args.quick else 300)
    warmup = 5 if args.quick else 20
    workloads = _workloads()
    chosen = [w for w in (args.only.split(",") if args.only else workloads) if w]
    print(f"--emulate-cuda per-step cost, torch {torch.__version__}, 1 thread, {rounds} rounds "
          f"(CPU time of the benchmark thread; median [interquartile range] of per-round ratios)")
    print(f"{'workload':<12} {'dtype':<9} {'cpu step':>9} {'emulated':>9} {'emulated/cpu':>22} "
          f"{'A/A cpu/cpu':>22} {'wall emulated/cpu':>22}")
    for name in chosen:
        result = _measure(name, workloads[name], rounds, warmup)

        def fmt(r):
            return f"{r[0]:.3f} [{r[1]:.3f}-{r[2]:.3f}]"

        print(f"{name:<12} {result['dtype']:<9} {result['cpu_step_ms']:>7.2f}ms "
              f"{result['emulated_step_ms']:>7.2f}ms {fmt(result['ratio']):>22} "
              f"{fmt(result['aa']):>22} {fmt(result['wall_ratio']):>22}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
