"""target-reduced-over-batch (GD172): what the batch-target watcher (instrument/batchtarget.py)
records of a regression target that holds a reduction over the batch of a model's output, and
the rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.rules.target_reduced_over_batch import _call_text, _fixed
from rule_traces import builder, findings, only

SLUG = "target-reduced-over-batch"


def _recorded(loss_of, steps=2):
    """``(op, dims, fn)`` of the ``batch_reduced_target`` events of ``loss_of(q, target_net)``'s
    loss over ``steps`` updates (q: a (16, 4) -> 3 network, target_net a copy)."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        q = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        target_net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        opt = torch.optim.SGD(q.parameters(), lr=0.1)
        for _ in range(steps):
            loss = loss_of(q, target_net)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["op"], e["dims"], e["fn"]) for e in rec.trace if e.kind == "batch_reduced_target"]


def _batch():
    return (torch.randn(16, 4), torch.randint(0, 3, (16, 1)), torch.randn(16),
            torch.randn(16, 4), (torch.rand(16) < 0.2).float())


def test_a_bootstrap_reduced_over_the_batch_is_recorded_once_per_line():
    def no_dim(q, target_net):
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            y = r + 0.9 * (1 - done) * target_net(s2).max()
        return F.smooth_l1_loss(q(s).gather(1, a).squeeze(1), y)
    assert _recorded(no_dim) == [("max", None, "smooth_l1_loss")]

    def dim0_handwritten(q, target_net):
        s, a, r, s2, done = _batch()
        y = r[:, None] + 0.9 * target_net(s2).detach().max(0)[0]
        return (q(s).gather(1, a) - y).pow(2).mean()
    assert _recorded(dim0_handwritten) == [("max", [0], "hand-written squared error")]

    def value_mean_target_first(q, target_net):  # CleanRL's order: the target as the input
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            v_next = target_net(s2)[:, 0].mean()
        return F.mse_loss(r + 0.9 * v_next, q(s)[:, 0])
    assert _recorded(value_mean_target_first) == [("mean", None, "mse_loss")]

    def loss_module(q, target_net):  # nn.MSELoss: its F.mse_loss runs inside a module call
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            y = r + 0.9 * target_net(s2).amax()
        return nn.MSELoss()(q(s).gather(1, a).squeeze(1), y)
    assert _recorded(loss_module) == [("amax", None, "mse_loss")]

    def expected_sum(q, target_net):
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            q2 = target_net(s2)
            y = r + 0.9 * (q2.softmax(1) * q2).sum()
        return F.huber_loss(q(s)[:, 0], y)
    assert _recorded(expected_sum) == [("sum", None, "huber_loss")]


def test_reductions_over_the_actions_normalisations_and_batch_losses_are_left_alone():
    def over_actions(q, target_net):
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            best = q(s2).argmax(1, keepdim=True)
            y1 = r + 0.9 * target_net(s2).max(1)[0] * (1 - done)
            y2 = r + 0.9 * target_net(s2).gather(1, best).squeeze(1) * done.logical_not()
            y3 = r + 0.9 * torch.min(target_net(s2), q(s2)).amax(dim=-1)
        pred = q(s).gather(1, a).squeeze(1)
        return F.mse_loss(pred, y1) + F.mse_loss(pred, y2) + ((pred - y3) ** 2).mean()
    assert _recorded(over_actions) == []

    def normalised(q, target_net):  # the reduction meets the values it was taken from
        s, a, r, s2, done = _batch()
        g = r + 0.9 * target_net(s2).detach().max(1)[0]
        g = (g - g.mean()) / (g.std() + 1e-6)
        return F.mse_loss(q(s)[:, 0], g - g.mean())
    assert _recorded(normalised) == []

    def batch_statistics(q, target_net):  # compared as batch statistics, not per sample
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            real = target_net(s2).mean(0)
        return F.mse_loss(q(s).mean(0), real)
    assert _recorded(batch_statistics) == []

    def data_reduced(q, target_net):  # a reduction of data, no model's output
        s, a, r, s2, done = _batch()
        return F.mse_loss(q(s)[:, 0], r - r.max() + torch.randn(16, 3).sum())
    assert _recorded(data_reduced) == []

    def evaluation(q, target_net):  # no side needs a gradient: nothing trains on it
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            F.mse_loss(q(s)[:, 0], r + target_net(s2).max())
        return q(s).pow(2).mean()
    assert _recorded(evaluation) == []


def test_a_batch_statistic_inside_a_forward_is_not_followed():
    class MinibatchStd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc(x)
            return h + h.std(0).mean()

    def inside(q, target_net):
        s, a, r, s2, done = _batch()
        with torch.no_grad():
            y = r + 0.9 * MinibatchStd()(s2).max(1)[0]
        return F.mse_loss(q(s)[:, 0], y)
    assert _recorded(inside) == []


def test_the_mode_and_hooks_are_gone_after_the_window_and_after_the_run():
    depth = torch._C._len_torch_function_stack()
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        net = nn.Linear(4, 1)
        net(torch.randn(8, 4))
        assert torch._C._len_torch_function_stack() > depth  # the window is open
        for _ in range(8):
            net(torch.randn(8, 4)).pow(2).mean().backward()
        assert torch._C._len_torch_function_stack() == depth  # closed after its windows
    assert torch._C._len_torch_function_stack() == depth
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        nn.Linear(4, 1)(torch.randn(8, 4))
    assert torch._C._len_torch_function_stack() == depth


def test_no_mode_is_pushed_inside_one_the_script_entered():
    from torch.overrides import TorchFunctionMode

    class Scripts(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    depth = torch._C._len_torch_function_stack()
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        net = nn.Linear(4, 1)
        with Scripts():
            net(torch.randn(8, 4))  # its exit pops the top of the stack: it must be its own
        assert torch._C._len_torch_function_stack() == depth
        net(torch.randn(8, 4))
        above = [torch._C._get_function_stack_at(i)
                 for i in range(depth, torch._C._len_torch_function_stack())]
        assert above and all(type(m).__module__.startswith("graddoctor.instrument.") for m in above)
    assert torch._C._len_torch_function_stack() == depth


def test_the_rule_warns_at_the_reduction_and_names_the_axis():
    t = builder()
    t.put(ev.batch_reduced_target(op="max", dims=None, batch=32, shape=[32, 2],
                                  fn="smooth_l1_loss", loss_line=20), line=18)
    t.backward(line=21)
    t.step(line=21)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 18
    assert "dim=1" in f.fix and "dim 0" in f.fix and "32" in f.message and "line 20" in f.message
    t = builder()
    t.put(ev.batch_reduced_target(op="mean", dims=None, batch=16, shape=[16],
                                  fn="mse_loss", loss_line=20), line=18)
    f = only(t, SLUG)
    assert "drop the `.mean(...)`" in f.fix and "its own" in f.message


def test_the_fix_rewrites_the_reduced_call_to_dim_1():
    assert _call_text("    next_q = target_net(s2).max()  # c\n", "max") == "target_net(s2).max()"
    assert _call_text("y = r + q_t(s2).max(dim=0).values * m\n", "max") == "q_t(s2).max(dim=0).values"
    assert _call_text("y = r + g * torch.logsumexp(q2, 0)\n", "logsumexp") == "torch.logsumexp(q2, 0)"
    assert _fixed("target_net(s2).max()", "max", None, 2) == "target_net(s2).max(dim=1).values"
    assert _fixed("q_t(s2).max(dim=0).values", "max", [0], 2) == "q_t(s2).max(dim=1).values"
    assert _fixed("q(s2).max(0)[0]", "max", [0], 2) == "q(s2).max(1)[0]"
    assert _fixed("(pi * q2).sum()", "sum", None, 2) == "(pi * q2).sum(dim=1)"
    assert _fixed("q.sum(dim=(0, 1))", "sum", [0, 1], 2) is None
    assert findings(builder(), SLUG) == []
