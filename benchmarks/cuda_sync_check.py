"""Host synchronisations graddoctor adds per optimizer update on CUDA (target: at most 1).

    python benchmarks/cuda_sync_check.py            # on a CUDA machine; < 2 minutes
    python benchmarks/cuda_sync_check.py --cpu      # dry run of the script's logic on CPU
    python benchmarks/cuda_sync_check.py --grad-flow  # with every update recorded for the pictures

A small transformer LM with fp16 autocast, ``torch.amp.GradScaler("cuda")``, ``unscale_``,
``clip_grad_norm_`` and AdamW runs a few steps plain and a few steps under exactly what
``graddoctor check`` installs (``Instrumentation(Recorder(None))``). For each arm, over the same
number of steps after a warm-up:

- torch.profiler counts, per step, the CUDA runtime calls that block the host
  (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, synchronous
  ``cudaMemcpy``) and the ATen scalar reads (``aten::item``, ``aten::_local_scalar_dense``);
- ``torch.cuda.set_sync_debug_mode("warn")`` counts every synchronising call torch itself
  flags (an independent second count, not tied to profiler event names).

The script passes when the instrumented arm adds at most one synchronisation per update by
either count (graddoctor's design: the per-update grad-norm summary is one batched
``torch._foreach_norm`` and one device-to-host read per step; nothing per parameter or per
hook). It exits 1 on failure, 0 on success, and 0 with a note when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402
from graddoctor.location import LocationFinder  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
WARMUP, STEPS, ALLOWED_PER_UPDATE = 3, 5, 1.0


def LM() -> nn.Module:
    """The overhead benchmark's transformer LM, smaller: a few seconds per step on a GPU."""
    from overhead import TinyLM  # benchmarks/ is sys.path[0] when this script runs

    return TinyLM(vocab=2048, layers=6)


def make_session(device: str):
    """Build everything inside the arm (as a script would) and return its step function."""
    torch.manual_seed(0)
    model = LM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp_dtype = torch.float16 if device == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device)
    tokens = torch.randint(0, 2048, (8, 65), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp_dtype):
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()

    return step, sum(1 for _ in model.parameters())


def count_syncs(device: str, instrument: bool, grad_flow: bool = False) -> tuple[Counter, int, int]:
    """Per-arm totals over STEPS steps: profiler event counts and sync-debug warnings."""
    from torch.profiler import ProfilerActivity, profile

    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec, grad_flow=grad_flow) if instrument else contextlib.nullcontext():
        step, n_tensors = make_session(device)
        for _ in range(WARMUP):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(STEPS):
                step()
        counts = Counter()
        for avg in prof.key_averages():
            if avg.key in SYNC_CALLS or avg.key in SCALAR_READS:
                counts[avg.key] += avg.count
        flagged = 0
        if device == "cuda":
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    for _ in range(STEPS):
                        step()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            flagged = sum(1 for w in caught if "synchroniz" in str(w.message).lower())
    return counts, flagged, n_tensors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU (checks the script, not CUDA)")
    parser.add_argument("--grad-flow", action="store_true",
                        help="also record every update's gradient norms, as a picture (-o "
                             "report.html) asks: they stay on the device until the run ends")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("cuda_sync_check: no CUDA device here; nothing checked (use --cpu for a dry run)")
        return 0
    device = "cpu" if args.cpu else "cuda"
    if hasattr(signal, "alarm"):
        signal.alarm(110)  # the check must end within 2 minutes, passing or failing
    started = time.perf_counter()
    plain, plain_flagged, n_tensors = count_syncs(device, instrument=False)
    instr, instr_flagged, _ = count_syncs(device, instrument=True, grad_flow=args.grad_flow)
    print(f"device {device} · torch {torch.__version__} · {n_tensors} parameter tensors · "
          f"{STEPS} profiled steps per arm{' · --grad-flow' if args.grad_flow else ''}")
    print(f"{'event':<28}{'plain/step':>12}{'graddoctor/step':>17}{'extra/step':>12}")
    extra_sync = extra_scalar = 0.0
    for key in SYNC_CALLS + SCALAR_READS:
        a, b = plain[key] / STEPS, instr[key] / STEPS
        print(f"{key:<28}{a:>12.2f}{b:>17.2f}{b - a:>12.2f}")
        if key in SYNC_CALLS:
            extra_sync += b - a
        else:
            extra_scalar = max(extra_scalar, b - a)  # item calls _local_scalar_dense: count once
    extra_flagged = (instr_flagged - plain_flagged) / STEPS
    if device == "cuda":
        print(f"{'sync-debug warnings':<28}{plain_flagged / STEPS:>12.2f}{instr_flagged / STEPS:>17.2f}"
              f"{extra_flagged:>12.2f}")
    worst = max(extra_sync, extra_scalar, extra_flagged)
    ok = worst <= ALLOWED_PER_UPDATE
    print(f"extra host synchronisations per update: {worst:.2f} (allowed {ALLOWED_PER_UPDATE:g}) -> "
          f"{'PASS' if ok else 'FAIL'} · {time.perf_counter() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
