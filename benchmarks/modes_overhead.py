"""Cost of watching BatchNorm/dropout forwards, min of many short repeats.

1. Mechanism: a global module forward pre-hook that only type-checks versus patching the
   ``forward`` of the BatchNorm/dropout classes with a wrapper that does nothing.
2. The real mode watcher: Instrumentation with and without it.

    OMP_NUM_THREADS=1 python benchmarks/modes_overhead.py
"""
import functools
import os
import sys
import timeit

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
KINDS = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


def block(c):
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())


CASES = [
    ("cnn: 24 BatchNorm + 1 dropout", nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), *[block(16) for _ in range(24)],
                                                     nn.Flatten(), nn.Dropout(0.1), nn.Linear(16 * 8 * 8, 10)),
     torch.randn(8, 3, 8, 8), 25),
    ("transformer: 12 dropout", nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, 0.1, batch_first=True),
                                                      4, enable_nested_tensor=False), torch.randn(8, 16, 64), 12),
    ("mlp: 80 modules, none watched", nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(32, 32), nn.ReLU())]),
     torch.randn(16, 32), 0),
]


def forward_us(model, x):
    model.train()
    with torch.no_grad():
        model(x)
        return min(timeit.repeat(lambda: model(x), number=5, repeat=40)) / 5 * 1e6


def with_hook(f):
    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: None if not isinstance(module, KINDS) else None)
    try:
        return f()
    finally:
        handle.remove()


def with_patch(f):
    classes = [nn.modules.batchnorm._BatchNorm] + [c for c in vars(nn.modules.dropout).values()
                                                   if isinstance(c, type) and "forward" in vars(c)
                                                   and issubclass(c, nn.modules.dropout._DropoutNd)]
    saved = [(c, c.forward) for c in classes]
    for c, original in saved:
        c.forward = functools.wraps(original)(lambda self, *a, _o=original, **k: _o(self, *a, **k))
    try:
        return f()
    finally:
        for c, original in saved:
            c.forward = original


def instrumented(f, modes: bool):
    inst = Instrumentation(Recorder(step_budget=None))
    if not modes:
        inst.watchers = [w for w in inst.watchers if type(w).__name__ != "ModeWatcher"]
    with inst:
        return f()


for name, model, x, watched in CASES:
    runs = {k: [] for k in ("plain", "hook", "patch", "instr", "instr+modes")}
    for _ in range(3):  # interleaved rounds: the minimum is robust to a busy machine
        f = functools.partial(forward_us, model, x)
        runs["plain"].append(f())
        runs["hook"].append(with_hook(f))
        runs["patch"].append(with_patch(f))
        runs["instr"].append(instrumented(f, modes=False))
        runs["instr+modes"].append(instrumented(f, modes=True))
    t = {k: min(v) for k, v in runs.items()}
    per_layer = f", {(t['instr+modes'] - t['instr']) / watched:.1f} us per watched layer" if watched else ""
    print(f"{name}: forward {t['plain']:.0f} us | global pre-hook {t['hook'] / t['plain']:.2f}x, "
          f"patched forward {t['patch'] / t['plain']:.2f}x | mode watcher "
          f"{t['instr+modes'] / t['instr']:.3f}x{per_layer}")
