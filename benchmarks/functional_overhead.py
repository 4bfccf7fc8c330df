"""Cost of watching functional dropout and regression losses, min of many short repeats.

Each case runs under ``Instrumentation`` with and without the two watchers
(``FunctionalDropoutWatcher``, ``LossShapeWatcher``); the difference is what they add per call.
Tiny tensors, so the Python overhead is not hidden behind the kernels; CPU time of this thread
(``time.thread_time``), so other processes on a shared machine do not count.

    OMP_NUM_THREADS=1 python benchmarks/functional_overhead.py
"""
import functools
import os
import sys
import time
import timeit
import warnings

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graddoctor.instrument import Instrumentation, Recorder  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
warnings.simplefilter("ignore")  # torch's shape warning on the broadcast case
OURS = ("FunctionalDropoutWatcher", "LossShapeWatcher")


class Functional(nn.Module):
    """A forward that calls F.dropout with its default training=True (the watched case)."""

    def forward(self, x):
        return F.dropout(x, 0.1)


x = torch.randn(4, 8)
row = torch.randn(8)
CASES = [  # name, build the callable (under the instrumentation), calls of a watched function
    ("nn.Dropout forward (training given)", lambda: functools.partial(nn.Dropout(0.1), x), 1),
    ("F.dropout default, train mode (module lookup)", lambda: functools.partial(Functional(), x), 1),
    ("F.dropout default, eval mode (line recorded)", lambda: functools.partial(Functional().eval(), x), 1),
    ("F.mse_loss, equal shapes", lambda: functools.partial(F.mse_loss, x, x), 1),
    ("F.mse_loss, (4, 8) vs (8,) broadcast", lambda: functools.partial(F.mse_loss, x, row), 1),
    ("TransformerEncoder, 4 layers x 3 nn.Dropout",
     lambda: functools.partial(nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, 0.1, batch_first=True), 4,
                                                     enable_nested_tensor=False), torch.randn(2, 8, 32)), 12),
]


def timed(build, ours: bool) -> float:
    inst = Instrumentation(Recorder(step_budget=None))
    if not ours:
        inst.watchers = [w for w in inst.watchers if type(w).__name__ not in OURS]
    with inst:
        f = build()
        f()
        return min(timeit.repeat(f, number=200, repeat=15, timer=time.thread_time)) / 200 * 1e6


for name, build, calls in CASES:
    runs = {True: [], False: []}
    for _ in range(7):  # interleaved rounds: the minimum is robust to a busy machine
        for ours in (False, True):
            runs[ours].append(timed(build, ours))
    without, with_ = min(runs[False]), min(runs[True])
    print(f"{name}: {without:.2f} us -> {with_:.2f} us ({with_ / without:.3f}x, "
          f"{(with_ - without) / calls:+.2f} us per watched call)")
