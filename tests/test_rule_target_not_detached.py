"""target-not-detached (GD245): what instrument/stopgrad.py records of a loss whose target keeps
the gradient of the input's parameters, and the rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.graphpaths import reached as _walk
from graddoctor.instrument.stopgrad import TargetGradWatcher, _base, _own_leaves, _producer
from rule_traces import builder, findings, only

SLUG = "target-not-detached"


class _Rec:
    """The recorder's parts the watcher uses: tracked tensors, here(), emit_aside."""

    def __init__(self, params):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.events = []

    def here(self, skip=2):
        return ("loc", len(self.events), id(object()))

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc


def _judge(model, losses):
    """The events the watcher records for the losses computed by ``losses(model)`` and one
    backward."""
    rec = _Rec(list(model.parameters()))
    watcher = TargetGradWatcher(rec)
    calls = []

    def run(fn, input, target):
        watcher._calls += 1
        watcher._check(fn, input, target)
        calls.append(fn)

    losses(model, run)
    watcher.describe_loss(None)
    return rec.events


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_a_bootstrapped_target_of_the_same_network_is_recorded():
    def losses(q, run):
        x, x2 = torch.randn(5, 4), torch.randn(5, 4)
        run("smooth_l1_loss", q(x).max(1)[0], 1.0 + 0.9 * q(x2).max(1)[0])
    (kind, data), = _judge(_net(), losses)
    assert kind == "target_grad" and data["fn"] == "smooth_l1_loss" and len(data["params"]) == 4


def test_a_pseudo_label_of_the_model_itself_is_recorded():
    def losses(m, run):
        x = torch.randn(5, 4)
        run("kl_div", F.log_softmax(m(x + 1), 1), F.softmax(m(x), 1))
    assert [made[0] for made in _judge(_net(), losses)] == ["target_grad"]


def test_symmetric_consistencies_and_mixtures_are_not():
    def losses(m, run):
        x = torch.randn(5, 4)
        p1, p2 = F.softmax(m(x + 1), 1), F.softmax(m(x - 1), 1)
        run("mse_loss", p1, p2)  # a Π-model: one layer makes both sides
        l1, l2 = m(x), m(x)
        run("kl_div", F.log_softmax(l1, 1), F.softmax(l2, 1))  # R-Drop: both ways round
        run("kl_div", F.log_softmax(l2, 1), F.softmax(l1, 1))
        mixture = ((p1 + p2) / 2).log()
        run("kl_div", mixture, p1)  # a Jensen-Shannon term: the input is made from the target
    assert _judge(_net(), losses) == []


def test_a_target_of_another_network_is_not():
    other = _net()

    def losses(m, run):
        x = torch.randn(5, 4)
        run("mse_loss", m(x), other(x))  # tracked: only m's parameters
    assert _judge(_net(), losses) == []


def test_a_prediction_from_another_layer_than_its_target_is_recorded():
    encoder, head = nn.Linear(4, 3), nn.Linear(3, 3)

    def losses(m, run):
        x = torch.randn(5, 4)
        run("mse_loss", head(encoder(x)), encoder(x + 1))
    model = nn.Sequential(encoder, head)
    assert [made[0] for made in _judge(model, losses)] == ["target_grad"]


def test_a_target_built_from_the_compared_activations_is_recorded_past_views():
    # an index of a view of the output: no weight next to either side's op, but the target is
    # made from the very activations the input is (a box target encoded against the prediction)
    def losses(m, run):
        x = torch.randn(5, 4)
        out = m(x).view(5, 3, 1)
        pos = torch.tensor([True, False, True, True, False])
        run("smooth_l1_loss", out[pos], (2.0 - out)[pos])
    assert [made[0] for made in _judge(_net(), losses)] == ["target_grad"]


def test_two_separate_passes_compared_past_views_are_a_consistency():
    def losses(m, run):
        x = torch.randn(5, 4)
        pos = torch.tensor([True, False, True, True, False])
        out1, out2 = m(x + 1).view(5, 3, 1), m(x - 1).view(5, 3, 1)
        run("mse_loss", out1[pos], out2[pos])
    assert _judge(_net(), losses) == []


def test_the_helpers_read_the_graph():
    m = _net()
    x = torch.randn(2, 4)
    out = F.softmax(m(x), 1).view(2, 3)
    assert type(_producer(out.grad_fn)).__name__ == "SoftmaxBackward0"
    assert type(_base(out.grad_fn)).__name__ == "AddmmBackward0"
    assert _own_leaves(_base(out.grad_fn)) == {id(m[2].weight), id(m[2].bias)}
    nodes, leaves = _walk(out.grad_fn, 1000)
    assert leaves == {id(p) for p in m.parameters()}
    assert _walk(out.grad_fn, 2) is None


def _trace(params, stepped=(0, 1)):
    t = builder(params=list(stepped))
    t.put(ev.target_grad(fn="mse_loss", params=list(params), input_op="AddmmBackward0",
                         target_op="AddBackward0"), line=9)
    t.clear(list(stepped), line=10)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_at_the_loss_call_when_an_optimizer_steps_those_parameters():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9 and f.evidence["params"] == [0, 1]
    assert "detach" in f.fix


def test_the_rule_is_silent_when_no_optimizer_steps_them():
    assert findings(_trace([5]), SLUG) == []
