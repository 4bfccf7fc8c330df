"""Python bytecodes per training step on tensor_count.py's shapes, graddoctor's and torch's.

    python benchmarks/step_opcodes.py                      # LoRA, 1,000 tensors, steps 1-40
    python benchmarks/step_opcodes.py --shape moe --tensors 1000 --steps 60 --range 4-33

Plain Python, no pytest. Counting only the files under ``graddoctor/`` misses two costs that a
window's global module hooks bring: the dispatching pair itself (compiled from source under the
file name ``<graddoctor: watched call>``, so that Dynamo inlines it) and torch's own slow path
of ``Module._call_impl`` that any global module hook switches on for every module call (the
``inner`` closure, the hook loops, ``is_compiling`` checks: about 150 bytecodes per module
call). This runs the shape's steps twice in one process, plain and under what ``graddoctor
check`` installs (``Instrumentation(Recorder(None))``), traces each step with ``sys.settrace``
and ``f_trace_opcodes``, and shows per step: graddoctor's own files, the wrappers of
``<graddoctor: ...>`` code, everything else (torch, the script) less the plain run's count of
that step, and the watchers whose module hooks are still held after it. Counts are
load-independent; a settrace'd step runs about 20 times slower than a plain one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ["OMP_NUM_THREADS"] = "1"

import tensor_count  # noqa: E402
from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402
from graddoctor.instrument.dependency import _tables  # noqa: E402
from graddoctor.location import LocationFinder  # noqa: E402

OURS, WRAPPERS, OTHER = 0, 1, 2


def _bucket(filename: str) -> int:
    if filename.startswith("<graddoctor"):
        return WRAPPERS
    return OURS if f"{os.sep}graddoctor{os.sep}" in filename else OTHER


def _held() -> str:
    names = []
    for table in list(_tables.values()):
        for entry in table._entries:
            hook = entry[0] or entry[1]
            owner = getattr(getattr(hook, "__self__", None), "__class__", None)
            name = owner.__name__ if owner is not None else getattr(hook, "__qualname__", "?")
            names.append(name + ("/outermost" if entry[5] else ""))
    return ",".join(sorted(names))


def count_steps(shape: str, tensors: int, steps: int, instrumented: bool) -> list[tuple]:
    """``[(ours, wrappers, other, held), ...]`` per step."""
    counts = [0, 0, 0]

    def trace(frame, event, arg):
        bucket = _bucket(frame.f_code.co_filename)
        frame.f_trace_opcodes = True

        def local(frame, event, arg):
            if event == "opcode":
                counts[bucket] += 1
            return local
        return local

    out = []
    context = (Instrumentation(Recorder(step_budget=None, finder=LocationFinder()))
               if instrumented else contextlib.nullcontext())
    with context:
        session = tensor_count.SHAPES[shape](tensors)
        for _ in range(steps):
            counts[:] = [0, 0, 0]
            sys.settrace(trace)
            try:
                session.step()
            finally:
                sys.settrace(None)
            out.append((*counts, _held() if instrumented else ""))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="lora", choices=sorted(tensor_count.SHAPES))
    p.add_argument("--tensors", type=int, default=1000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--range", default="4-33",
                   help="steps averaged in the summary (tensor_count.py's rounds: 4-33)")
    p.add_argument("--quiet", action="store_true", help="the summary only")
    args = p.parse_args(argv)
    plain = count_steps(args.shape, args.tensors, args.steps, False)
    checked = count_steps(args.shape, args.tensors, args.steps, True)
    if not args.quiet:
        print(f"{'step':>4} {'plain':>8} {'graddoctor':>10} {'wrappers':>8} {'torch+':>8}  "
              f"module hooks held after the step")
    rows = []
    for i, ((_, _, base, _), (ours, wrappers, other, held)) in enumerate(zip(plain, checked), 1):
        rows.append((i, base, ours, wrappers, other - base))
        if not args.quiet:
            print(f"{i:>4} {base:>8} {ours:>10} {wrappers:>8} {other - base:>8}  {held}")
    first, last = (int(x) for x in args.range.split("-"))
    picked = [r for r in rows if first <= r[0] <= last]
    if picked:
        k = len(picked)
        mean = [sum(r[j] for r in picked) / k for j in range(1, 5)]
        print(f"steps {first}-{last}, mean per step: plain {mean[0]:.0f}, graddoctor's files "
              f"{mean[1]:.0f}, its <graddoctor: ...> wrappers {mean[2]:.0f}, torch's and the "
              f"script's beyond plain {mean[3]:.0f}; all of graddoctor's doing "
              f"{mean[1] + mean[2] + mean[3]:.0f}")


if __name__ == "__main__":
    main()
