"""Reading a loss's graph never unpacks what a non-reentrant checkpoint saved: unpacking runs the
checkpointed region's forward again, which updates BatchNorm's running statistics once more and
runs the script's own code (graphpaths.packed). The script's forwards, and what they compute,
are the same with and without graddoctor."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder


class Block(nn.Module):
    """Softmax before a product, a log_softmax, powers, exps and products by constants: what
    the graph-reading watchers look at, all inside the checkpointed region."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(6)
        self.qkv = nn.Linear(8, 24)
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        x = self.bn(x)
        q, k, v = self.qkv(x).chunk(3, -1)
        h = (F.softmax(q @ k.transpose(1, 2) / math.sqrt(8), dim=1) @ v).mean(1)
        nll = F.nll_loss(F.log_softmax(h, dim=-1), y)
        return 0.5 * nll + 0.1 * (h ** 2).mean() - 0.01 * torch.exp(-h.abs()).mean()


def _run() -> tuple[int, list]:
    torch.manual_seed(0)
    block = Block()
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    x, y = torch.randn(16, 6, 8), torch.randint(0, 8, (16,))
    for _ in range(4):
        opt.zero_grad()
        checkpoint(block, x, y, use_reentrant=False).backward()
        opt.step()
    return block.calls, [t.detach().clone() for t in block.state_dict().values()]


def test_a_checkpointed_forward_runs_as_often_and_computes_the_same_under_graddoctor():
    plain_calls, plain_state = _run()
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        calls, state = _run()
    assert calls == plain_calls == 8  # each forward once, and its one recomputation in the backward
    assert all(torch.equal(a, b) for a, b in zip(plain_state, state))
