"""grad-graph-unused (GD193): what instrument/gradgraph.py records of gradients taken with
create_graph=True that no later backward or autograd.grad differentiates, and the rule over
hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from graddoctor import events as ev
from graddoctor.instrument.gradgraph import GradGraphWatcher
from graddoctor.trace import Location
from rule_traces import builder, findings, only

SLUG = "grad-graph-unused"


class _Rec:
    """The recorder's parts the watcher uses; ``line`` is where the script is."""

    def __init__(self):
        self.events = []
        self.line = 0
        self.retired = []

    def here(self, skip=2):
        return Location("train.py", self.line)

    def emit_aside(self, made, loc=None):
        self.events.append((made, loc))

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        self.retired.append(topic)


class _Script:
    """A script's autograd.grad, backward and step, seen by the watcher as the installed
    wrappers and the recorder's topics would show them."""

    def __init__(self):
        self.rec = _Rec()
        self.watcher = GradGraphWatcher(self.rec)

    def grad(self, line, outputs, inputs, **kwargs):
        self.rec.line = line
        self.watcher._before((outputs, inputs), kwargs)
        result = torch.autograd.grad(outputs, inputs, **kwargs)
        self.watcher._after(result)
        return result

    def backward(self, line, loss):
        self.rec.line = line
        self.watcher.describe_loss(loss)
        loss.backward()

    def step(self, optimizer):
        optimizer.step()
        optimizer.zero_grad()
        self.watcher.after_step(0, optimizer)


def _maml(adapted: bool, steps=3, create_graph=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = _Script()
    for _ in range(steps):
        for _task in range(2):
            xs, xq = torch.randn(6, 1), torch.randn(6, 1)
            params = dict(model.named_parameters())
            grads = s.grad(10, F.mse_loss(functional_call(model, params, (xs,)), xs.sin()),
                           list(params.values()), create_graph=create_graph)
            fast = {n: p - 0.1 * g for (n, p), g in zip(params.items(), grads)}
            out = functional_call(model, fast, (xq,)) if adapted else model(xq)
            s.backward(12, F.mse_loss(out, xq.sin()))
        s.step(opt)
    return s.rec.events


def test_a_query_loss_of_the_unadapted_model_is_recorded_once_at_the_grad_call():
    ((kind, data), loc), = _maml(adapted=False)
    assert kind == "grad_graph_unused" and loc.line == 10
    assert data == {"backward": ["train.py", 12], "steps": 2}


def test_the_adapted_weights_first_order_maml_and_a_single_step_are_not():
    assert _maml(adapted=True) == []
    assert _maml(adapted=False, create_graph=False) == []  # no graph: nothing asked for
    assert _maml(adapted=False, steps=1) == []  # unused at one step only


def _maml_steps(adapted: bool, inner_steps=2, steps=3):
    """MAML with several inner steps on one grad line, each differentiating the previous one's
    adapted weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = _Script()
    for _ in range(steps):
        xs, xq = torch.randn(6, 1), torch.randn(6, 1)
        fast = dict(model.named_parameters())
        for _inner in range(inner_steps):
            grads = s.grad(10, F.mse_loss(functional_call(model, fast, (xs,)), xs.sin()),
                           list(fast.values()), create_graph=True)
            fast = {n: p - 0.1 * g for (n, p), g in zip(fast.items(), grads)}
        out = functional_call(model, fast, (xq,)) if adapted else model(xq)
        s.backward(12, F.mse_loss(out, xq.sin()))
        s.step(opt)
    return s.rec.events


def test_inner_steps_that_only_feed_each_other_are_unused_when_the_query_loss_reads_none():
    ((kind, data), loc), = _maml_steps(adapted=False)
    assert kind == "grad_graph_unused" and loc.line == 10 and data["steps"] == 2
    assert _maml_steps(adapted=True) == []
    assert _maml_steps(adapted=True, inner_steps=3) == []


def test_a_gradient_differentiated_by_a_grad_without_graph_is_used():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    s = _Script()
    weights = [net[0].weight, net[2].weight]
    for _ in range(3):
        loss = net(torch.randn(4, 2)).pow(2).mean()
        g = s.grad(20, loss, weights, create_graph=True)
        v = [torch.randn_like(w) for w in weights]
        s.grad(21, g, weights, grad_outputs=v, retain_graph=True)  # a Hessian-vector product, logged
        s.backward(22, loss)
        s.step(opt)
    assert s.rec.events == []


def _pinn(use_second: bool, lazy: bool = False, split: bool = False, steps=3):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    s = _Script()
    for step in range(steps):
        x = torch.rand(16, 1, requires_grad=True)
        u = net(x)
        u_x, = s.grad(20, u, x, grad_outputs=torch.ones_like(u), create_graph=True)
        u_xx, = s.grad(21, u_x, x, grad_outputs=torch.ones_like(u_x), create_graph=True)
        boundary = net(torch.zeros(1, 1)).pow(2).sum()
        residual = (u_xx + u).pow(2).mean()
        if split:
            s.backward(24, boundary)
            s.backward(25, residual)
        else:
            used = use_second and (not lazy or step % 2 == 0)
            s.backward(24, boundary + residual if used else boundary)
        s.step(opt)
    return s.rec.events


def test_a_derivative_differentiated_again_or_backpropagated_separately_is_used():
    assert _pinn(use_second=True) == []  # u_x feeds the grad of u_xx, which the loss reads
    assert _pinn(use_second=True, split=True) == []  # two backwards before one step
    assert _pinn(use_second=True, lazy=True) == []  # used at one step out of two


def test_a_residual_left_out_of_the_loss_is_recorded_at_its_line_only():
    (made, loc), = _pinn(use_second=False)
    assert loc.line == 21 and made[1]["backward"] == ["train.py", 24]


def test_the_watcher_leaves_its_topics_after_its_steps():
    s = _Script()
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    for _ in range(6):
        s.step(opt)
    assert len(s.rec.retired) == 2


def _trace(backward=("train.py", 14)):
    t = builder()
    t.clear([0, 1], line=9)
    t.put(ev.grad_graph_unused(backward=list(backward) if backward else None, steps=2), line=11)
    t.backward(fresh=[0, 1], line=14)
    t.step(0, line=15)
    return t


def test_the_rule_points_at_the_call_without_a_readable_loss_assignment():
    f = only(_trace(), SLUG)
    assert f.location.line == 11 and f.evidence["steps"] == 2
    assert [r.location.line for r in f.related] == [14]
    assert "create_graph=True" in f.message and "functional_call" in f.fix
    assert only(_trace(backward=None), SLUG).related == ()


def test_the_rule_points_at_the_loss_assignment_after_the_call(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    lines = ["x = 0"] * 20
    lines[10] = "g = grad(loss, x, create_graph=True)"
    lines[12] = "loss = ce"
    lines[13] = "loss.backward()"
    script.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    f = only(_trace(), SLUG)
    assert f.location.line == 13 and "`loss = ce`" in f.message
    assert sorted(r.location.line for r in f.related) == [11, 14]
    assert findings(builder(), SLUG) == []


def test_the_rule_points_past_a_rescale_of_the_loss_at_the_statement_of_its_terms(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    lines = ["x = 0"] * 20
    lines[10] = "g = grad(loss, x, create_graph=True)"
    lines[11] = "meta_loss = meta_loss + crit(model(xq), yq)"
    lines[12] = "meta_loss = meta_loss / tasks"
    lines[13] = "meta_loss.backward()"
    script.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    f = only(_trace(), SLUG)
    assert f.location.line == 12 and "crit(model(xq), yq)" in f.message


def test_the_rule_points_past_a_running_sum_at_the_statement_of_its_term(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    lines = ["x = 0"] * 20
    lines[10] = "g = grad(loss, x, create_graph=True)"
    lines[11] = "query_loss = crit(model(xq), yq)"
    lines[12] = "meta_loss = meta_loss + query_loss"
    lines[13] = "meta_loss.backward()"
    script.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    f = only(_trace(), SLUG)
    assert f.location.line == 12 and "crit(model(xq), yq)" in f.message


def test_a_term_assigned_before_the_grad_call_is_not_followed(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    lines = ["x = 0"] * 20
    lines[9] = "penalty = crit(model(xq), yq)"
    lines[10] = "g = grad(loss, x, create_graph=True)"
    lines[12] = "total = total + penalty"
    lines[13] = "total.backward()"
    script.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    f = only(_trace(), SLUG)
    assert f.location.line == 13 and "total = total + penalty" in f.message
