"""log-det-misses-positions (GD346): the graph reading of instrument/logdetpositions.py and the
rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.logdetpositions import LogDetPositionsWatcher
from rule_traces import findings

SLUG = "log-det-misses-positions"


class _Rec:
    def __init__(self):
        self.told = []
        self.tensors = type("T", (), {"number": {}, "refs": {}})()

    def emit_aside(self, made, loc):
        self.told.append(made[1])


def _told(loss):
    watcher = LogDetPositionsWatcher.__new__(LogDetPositionsWatcher)
    watcher.rec, watcher._done = _Rec(), set()
    watcher._judge(loss.grad_fn, None)
    return watcher.rec.told


def _invconv(factor, size=4):
    w = torch.linalg.qr(torch.randn(3, 3))[0].requires_grad_(True)
    x = torch.randn(2, 3, size, size)
    z = F.conv2d(x, w.view(3, 3, 1, 1))
    log_pz = -0.5 * (z ** 2).flatten(1).sum(1)
    logdet = torch.slogdet(w)[1] if factor is None else factor * torch.slogdet(w)[1]
    return -(log_pz + logdet).mean()


def _actnorm(factor, size=4):
    logs = torch.zeros(1, 3, 1, 1, requires_grad=True)
    x = torch.randn(2, 3, size, size)
    z = x * torch.exp(logs)
    logdet = logs.sum() if factor is None else logs.sum() * factor
    return -(-0.5 * (z ** 2).flatten(1).sum(1) + logdet).mean()


def test_a_log_det_counted_once_is_told_with_its_positions():
    told, = _told(_invconv(None))
    assert told["op"] == "slogdet" and told["positions"] == 16
    told, = _told(_actnorm(None, size=3))
    assert told["op"] == "sum" and told["positions"] == 9


def test_a_log_det_scaled_by_the_positions_or_over_one_position_is_not():
    assert _told(_invconv(16)) == []
    assert _told(_actnorm(16)) == []
    assert _told(_invconv(None, size=1)) == []
    assert _told(_actnorm(None, size=1)) == []


def _trace(op):
    from rule_traces import builder
    t = builder()
    t.put(ev.log_det_positions(op=op, positions=16, params=[], line=9), line=9)
    t.backward(fresh=[0], line=9)
    t.step(0, line=10)
    return t.trace


def test_the_rule_warns_with_the_positions_in_its_fix():
    f, = findings(_trace("slogdet"), SLUG)
    assert "16" in f.message and "h * w" in f.fix
