"""optimizer-step-ignores-group-lr (GD421): an optimizer class of the script's own whose step()
applies self.defaults["lr"] / self.lr while the run gave its param groups other lrs."""

from __future__ import annotations

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from lr_traces import P

SLUG = "optimizer-step-ignores-group-lr"

_CLASS = """import torch
class Mine(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))
        self.lr = lr

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-{read})
opt = Mine(params)
"""


def _found(tmp_path, read, lrs, cls="Mine"):
    script = tmp_path / "train.py"
    script.write_text(_CLASS.replace("{read}", read))
    t = TraceBuilder(str(script))
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls=cls, params=list(P), lrs=[lrs[0]]), 12)
    for lr in lrs:
        t.clear(P, line=20)
        t.backward(fresh=P, line=21)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 22)
        t.step(0, line=22)
    t.put(ev.run_end(status="completed", steps=len(lrs)))
    return list(find_rule(SLUG)().check(Analysis(t.trace)))


@pytest.mark.parametrize("read", ['self.defaults["lr"]', "self.lr", 'self.defaults.get("lr")'])
def test_a_step_reading_the_constructor_lr_under_a_schedule_is_found(tmp_path, read):
    f = _found(tmp_path, read, [0.1, 0.1, 0.01, 0.01])
    assert len(f) == 1 and f[0].location.line == 11 and f[0].evidence["lrs"] == [0.01, 0.1]
    assert "lr 0.1 at the first step and lr 0.01 at the last" in f[0].message
    assert 'group["lr"]' in f[0].fix and read in f[0].message


@pytest.mark.parametrize("read,lrs,cls", [
    ('group["lr"]', [0.1, 0.01], "Mine"),  # reads the group's lr
    ("self.lr", [0.1, 0.1, 0.1], "Mine"),  # one lr over the run: the same value
    ("self.lr", [0.1, 0.01], "SGD"),  # not a class of the script
])
def test_silent(tmp_path, read, lrs, cls):
    assert _found(tmp_path, read, lrs, cls) == []
