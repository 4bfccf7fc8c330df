"""graddoctor's per-step cost against the number of parameter tensors.

    python benchmarks/tensor_count.py            # 100, 1,000, 10,000, 30,000 tensors
    python benchmarks/tensor_count.py --quick    # fewer rounds; 100, 1,000, 10,000
    python benchmarks/tensor_count.py --profile moe:10000   # cProfile of instrumented steps

Plain Python + torch, no pytest (the repository root is put on sys.path).

Two model shapes with many small tensors, so that plain PyTorch stays fast and what graddoctor
does per tensor shows:

* **MoE**: ``L`` layers of ``E`` tiny experts (``Linear(16, 16)``: two tensors each) and a
  router, top-2 routing of 32 tokens, so each step only some experts get a gradient (as in a
  mixture-of-experts LLM: most tensors idle in any one update); AdamW, clip_grad_norm_.
* **LoRA**: ``L`` layers of adapted ``Linear(16, 16)``s whose base weight is frozen and whose
  two low-rank adapters (rank 4) train; every adapter gets a gradient each step; AdamW over the
  adapters only, clip_grad_norm_.

The tensor count is the number of tensors the optimizer owns (what graddoctor tracks). Timing
is ``benchmarks/overhead.py``'s: the instrumentation installed once (what ``graddoctor check``
installs, ``Instrumentation(Recorder(None))``) and toggled out for the plain arms, rounds that
time one step of each arm (instrumented I, plain P, plain P2) in all six orders, CPU time of
this thread (one torch thread); the table shows the median I/P ratio of the rounds with a 95%
confidence interval, and the A/A ratio P2/P, the noise floor. The heap as it is after the
warm-up is frozen (``gc.freeze``): a full collection over three big models otherwise lands on
one arm's step at random (``--no-freeze`` to see it).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import overhead  # noqa: E402  (its interleaved steps and median_ci95)
from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402
from graddoctor.location import LocationFinder  # noqa: E402

torch.set_num_threads(1)
D = 16  # feature width: tiny tensors


class MoELayer(nn.Module):
    def __init__(self, experts: int):
        super().__init__()
        self.router = nn.Linear(D, experts)
        self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(experts))

    def forward(self, x):
        weights, chosen = torch.topk(self.router(x).softmax(-1), 2, dim=-1)
        out = torch.zeros_like(x)
        for e in chosen.unique().tolist():
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            out = out.index_add(0, rows, weights[rows, slot, None] * self.experts[e](x[rows]))
        return x + out


class LoRALinear(nn.Module):
    def __init__(self, rank: int = 4):
        super().__init__()
        self.base = nn.Linear(D, D, bias=False)
        self.base.weight.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, D) * 0.1)
        self.lora_b = nn.Parameter(torch.zeros(D, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()


class Session(overhead.Session):
    """One training step as a script writes it: zero_grad, forward, backward, clip, step."""

    def step(self) -> None:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()


def _session(model) -> Session:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    batches = [(torch.randn(32, D), torch.randn(32, D)) for _ in range(2)]
    session = Session(model, optimizer, batches)
    session.params = params
    return session


def build_moe(tensors: int) -> Session:
    torch.manual_seed(0)
    layers = 4 if tensors <= 100 else 8 if tensors <= 1000 else 48
    experts = max(2, round((tensors / layers - 2) / 2))
    return _session(nn.Sequential(*(MoELayer(experts) for _ in range(layers))))


def build_lora(tensors: int) -> Session:
    torch.manual_seed(0)
    layers = max(1, tensors // 2)
    # a deep chain of tiny adapted linears in blocks (a real model's depth is split in layers)
    blocks = [nn.Sequential(*(LoRALinear() for _ in range(min(50, layers - i))))
              for i in range(0, layers, 50)]
    return _session(nn.Sequential(*blocks))


SHAPES = {"moe": build_moe, "lora": build_lora}


def per_step(shape: str, tensors: int, rounds: int, warmup: int, freeze_heap: bool = True,
             plain_warmup: int | None = None) -> dict:
    samples, session = overhead.interleaved(lambda: SHAPES[shape](tensors), rounds, warmup,
                                            freeze_heap=freeze_heap, plain_warmup=plain_warmup)
    ratios = [i[1] / p[1] for i, p in zip(samples["I"], samples["P"])]
    aa = [b[1] / p[1] for b, p in zip(samples["P2"], samples["P"])]
    return {"shape": shape, "tensors": len(session.params), "rounds": rounds,
            "plain_ms": 1e3 * statistics.median(p[1] for p in samples["P"]),
            "ratio": statistics.median(ratios), "ci95": overhead.median_ci95(ratios),
            "aa": statistics.median(aa)}


def profile(shape: str, tensors: int, steps: int = 20) -> None:
    instrumentation = Instrumentation(Recorder(step_budget=None, finder=LocationFinder()))
    with instrumentation:
        session = SHAPES[shape](tensors)
        for _ in range(3):
            session.step()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            session.step()
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds, up to 10,000 tensors")
    p.add_argument("--counts", default="", help="comma-separated tensor counts")
    p.add_argument("--shapes", default="moe,lora")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3,
                   help="instrumented steps before the timed rounds (the default: the early "
                        "steps, every hook reading in full; 100 or more: past the start of the "
                        "skim of a model of 1,000 tensors or more, see fold.scaled_start)")
    p.add_argument("--plain-warmup", type=int, default=None,
                   help="warm-up steps of the plain copies (default: --warmup); a few are "
                        "enough, and save most of a long warm-up's time at 10,000 tensors")
    p.add_argument("--profile", help="shape:count, e.g. moe:10000: cProfile instrumented steps")
    p.add_argument("--no-freeze", action="store_true",
                   help="leave the warmed-up heap to the collector's full collections (see "
                        "overhead.interleaved): noisier at 10,000 tensors and more")
    args = p.parse_args(argv)
    if args.profile:
        shape, count = args.profile.split(":")
        profile(shape, int(count))
        return
    counts = ([int(c) for c in args.counts.split(",")] if args.counts
              else [100, 1000, 10000] if args.quick else [100, 1000, 10000, 30000])
    print(f"{'shape':6} {'tensors':>8} {'rounds':>6} {'plain ms':>9} {'I/P cpu':>8} "
          f"{'95% CI':>15} {'A/A':>6}")
    for count in counts:
        for shape in args.shapes.split(","):
            # fewer rounds for the big models: a step there is long and its ratio steady
            rounds = args.rounds or (12 if count >= 10000 else 30 if count >= 1000 else 120)
            if args.quick:
                rounds = max(6, rounds // 2)
            row = per_step(shape, count, rounds, warmup=args.warmup,
                           freeze_heap=not args.no_freeze, plain_warmup=args.plain_warmup)
            lo, hi = row["ci95"]
            print(f"{row['shape']:6} {row['tensors']:>8} {row['rounds']:>6} "
                  f"{row['plain_ms']:>9.2f} {row['ratio']:>8.3f} {f'[{lo:.3f}, {hi:.3f}]':>15} "
                  f"{row['aa']:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
