"""graddoctor's per-step cost inside PyTorch Lightning, next to the same model in a plain loop.

    python benchmarks/framework_overhead.py            # about 2 minutes on 2 CPU cores
    python benchmarks/framework_overhead.py --quick    # smoke run

Needs ``lightning`` (pip install graddoctor[frameworks]). The model is the Python-bound tiny MLP
of benchmarks/overhead.py (20 parameter tensors, AdamW, clip_grad_norm_ at 1.0), once in a
hand-written loop and once as a LightningModule fitted by ``Trainer(gradient_clip_val=1.0)``
(automatic optimization: every zero_grad/backward/step goes through Lightning's frames, so each
of graddoctor's locations walks them and maps the call to the user's hook).

Each round runs one arm for ``--steps`` optimizer steps: plain loop (P), plain loop under the
instrumentation (I), Lightning (LP), Lightning under the instrumentation (LI), installed around
the whole run as ``graddoctor check`` does; the order of the four arms cycles through rounds.
A step is timed with the CPU time of the thread (thread_time: excludes time other processes held
the core; one torch thread): in the loop around its body, in Lightning from
``on_train_batch_start`` to ``on_train_batch_end`` (the training_step, backward, clipping and
optimizer step of one batch). The first steps of a run are warm-up. Printed: the median step
time of each arm and the ratios I/P and LI/LP (median of per-round ratios).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402
from graddoctor.location import LocationFinder  # noqa: E402

torch.set_num_threads(1)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    dims = [32] + [64] * 9 + [10]
    mods: list[nn.Module] = []
    for i in range(10):
        mods += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def batches(n: int):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(n)]


def plain_run(steps: int, warmup: int) -> list[float]:
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i, (x, y) in enumerate(batches(steps + warmup)):
        t0 = time.thread_time()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if i >= warmup:
            times.append(time.thread_time() - t0)
    return times


def lightning_run(steps: int, warmup: int) -> list[float]:
    import lightning as L
    from torch.utils.data import DataLoader

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Timer(L.Callback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_train_batch_start(self, *args):
            self.t0 = time.thread_time()

        def on_train_batch_end(self, *args):
            self.times.append(time.thread_time() - self.t0)

    timer = Timer()
    trainer = L.Trainer(max_steps=steps + warmup, gradient_clip_val=1.0, accelerator="cpu",
                        enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, callbacks=[timer],
                        default_root_dir=tempfile.mkdtemp())
    loader = DataLoader(batches(steps + warmup), batch_size=None)
    trainer.fit(Module(), loader)
    return timer.times[warmup:]


def run(arm: str, steps: int, warmup: int) -> float:
    body = lightning_run if arm.startswith("L") else plain_run
    if arm.endswith("I"):
        with Instrumentation(Recorder(step_budget=None, finder=LocationFinder())):
            times = body(steps, warmup)
    else:
        times = body(steps, warmup)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--steps", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import lightning  # noqa: F401
    except ImportError:
        print("lightning is not installed: pip install graddoctor[frameworks]")
        return 0
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    rounds = args.rounds or (4 if args.quick else 12)
    steps = args.steps or (40 if args.quick else 150)
    arms = ["P", "I", "LP", "LI"]
    results: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(rounds):
        order = arms[r % 4:] + arms[:r % 4]
        for arm in order:
            results[arm].append(run(arm, steps, warmup=10))
    med = {a: statistics.median(v) for a, v in results.items()}
    plain_ratio = statistics.median(i / p for i, p in zip(results["I"], results["P"]))
    light_ratio = statistics.median(i / p for i, p in zip(results["LI"], results["LP"]))
    print(f"tiny MLP (20 tensors), AdamW + clip, {rounds} rounds of {steps} steps, CPU time per step")
    print(f"  plain loop   P  {med['P'] * 1e3:.3f} ms   under graddoctor I  {med['I'] * 1e3:.3f} ms   "
          f"I/P  {plain_ratio:.3f}")
    print(f"  Lightning    LP {med['LP'] * 1e3:.3f} ms   under graddoctor LI {med['LI'] * 1e3:.3f} ms   "
          f"LI/LP {light_ratio:.3f}")
    print(f"  graddoctor's added time per step: plain {(med['I'] - med['P']) * 1e6:.0f} µs, "
          f"Lightning {(med['LI'] - med['LP']) * 1e6:.0f} µs; Lightning's own: "
          f"{(med['LP'] - med['P']) * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
