"""Where graddoctor's per-step time goes, on the overhead benchmark's workloads.

    python benchmarks/hot_paths.py [--steps 200] [--only mlp,cnn,transformer]

For each workload, two views of the instrumented step:
- cProfile over a few hundred steps, attributing to graddoctor its functions' own time plus
  what they call outside graddoctor, except the originals its wrappers call (the user's own
  backward, zero_grad...). cProfile inflates call-heavy Python roughly 2-5x: compare entries
  with each other, not with the step time.
- direct timings (min of repeats, no profiler) of the pieces that run once per backward or per
  step: the graph walk (now run on a sample of backwards), the grads read before and after a
  backward, the step's pass over its grads, the grad-norm summary (first and last updates, or
  when nothing vouched for the grads), the post-step refresh and the user-location lookup.
Record these before and after a change to the instrumentation.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import timeit
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

_parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
_parser.add_argument("--steps", type=int, default=200)
_parser.add_argument("--only", default="mlp,cnn,transformer")
_ARGS = _parser.parse_args(None if __name__ == "__main__" else [])

import overhead as ob  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402
from graddoctor.instrument import backward as bw  # noqa: E402
from graddoctor.instrument import optim as op  # noqa: E402
from graddoctor.location import LocationFinder  # noqa: E402


def _us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def profile_workload(name: str, builder, steps: int) -> None:
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec) as inst:
        session = builder()
        for _ in range(3):
            session.step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(max(steps // (10 if name == "transformer" else 1), 10)):
            session.step()
        prof.disable()
        n = session.i - 3
        stats = pstats.Stats(prof).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
        total = sum(v[2] for v in stats.values()) / n
        own = _graddoctor_time(stats)
        print(f"\n{name}: {n} profiled steps, {total * 1e3:.2f} ms/step under cProfile")
        for func, us in sorted(own.items(), key=lambda kv: -kv[1])[:TOP]:
            print(f"  {func:<40}{us / n * 1e6:>9.1f} us/step")
        mine = sum(own.values()) / n
        print(f"  {'total graddoctor':<40}{mine * 1e6:>9.1f} us/step "
              f"({100 * mine / total:.1f}% of the profiled step)")
        direct_timings(rec, inst, session)
        del session


def _is_ours(path: str) -> bool:
    return f"graddoctor{os.sep}" in path and f"benchmarks{os.sep}" not in path


# graddoctor's wrappers around the user's own calls: what they call outside graddoctor is the
# wrapped original (the user's backward, zero_grad, clip...), not overhead
TOP = 8
_WRAPPERS = {"backward", "zero_grad", "add_param_group", "__iter__", "__next__", "__len__",
             "_initial_step", "clip", "compile", "forward", "requires_grad_", "reset_running_stats",
             "scale", "step", "train", "unscale_", "update", "update_bn", "wrapper", "wrapped"}


def _graddoctor_time(stats) -> dict[str, float]:
    """Time spent in graddoctor's own code: its functions' own time plus everything they call,
    except the wrapped originals (the user's backward, zero_grad, step...), per graddoctor entry."""
    own: dict[str, float] = {}
    for (path, line, func), (_cc, _nc, tt, _ct, callers) in stats.items():
        if _is_ours(path):
            key = f"{os.path.basename(path)}:{func}"
            own[key] = own.get(key, 0.0) + tt
            continue
        for (cpath, _cline, cfunc), (_c, _n, _t, cct) in callers.items():
            if _is_ours(cpath) and cfunc not in _WRAPPERS:
                key = f"{os.path.basename(cpath)}:{cfunc} -> {func}"
                own[key] = own.get(key, 0.0) + cct
    return own


def direct_timings(rec, inst, session) -> None:
    """Time each piece on its own (no profiler), with the session's own graph and grads."""
    x, y = session.batches[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=session.amp):
        out = session.model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    leaves = bw._leaves(loss, None)
    pids = rec.opt_params.get(0, [])
    watcher = inst.backward

    def before_and_after():
        ctx = bw.BackwardContext()
        watcher.read_before(ctx)
        watcher.end(ctx, None, {})

    rows = [
        (f"graph walk ({len(leaves)} leaves)", lambda: bw._leaves(loss, None), 50),
        (f"grads before + after a backward ({len(rec.tracked_pids())} tensors)", before_and_after, 200),
        (f"step pass ({len(pids)} grads)", lambda: op.step_grads(rec, pids, []), 500),
        (f"grad_norms ({len(pids)} grads)", lambda: op.grad_norms(rec, pids), 200),
        ("after_step", lambda: rec.grads.after_step(pids), 500),
        ("location lookup rec.here()", lambda: rec.here(1), 2000),
    ]
    for label, fn, number in rows:
        print(f"    {label:<46}{_us(fn, number):>9.2f} us")


def main() -> None:
    builders = {"mlp": ob.build_mlp, "cnn": ob.build_cnn, "transformer": ob.build_transformer}
    for name in _ARGS.only.split(","):
        profile_workload(name, builders[name], _ARGS.steps)


if __name__ == "__main__":
    main()
