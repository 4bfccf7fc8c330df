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
        self.asked = 0

    def here(self, skip=2):
        self.asked += 1
        return ("loc", self.asked)  # every call and backward a line of its own

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED: no later phase here
        pass


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


# -- hand-written losses, read from the loss's graph at the backward ------------------------

def _read(model, make_loss):
    """The events the watcher records for the hand-written loss ``make_loss(model)`` at its
    backward (no built-in loss called)."""
    rec = _Rec(list(model.parameters()))
    watcher = TargetGradWatcher(rec)
    watcher.describe_loss(make_loss(model))
    return rec.events


def _forms(model, make_loss):
    return [(kind, data["fn"]) for kind, data in _read(model, make_loss)]


def test_a_soft_pseudo_label_in_a_hand_written_cross_entropy_is_recorded():
    def loss(m):
        x = torch.randn(6, 4)
        q = F.softmax(m(x), -1)
        return -(q * F.log_softmax(m(x + 0.5), -1)).sum(-1).mean()
    assert _forms(_net(), loss) == [("target_grad", "hand-written cross-entropy")]


def test_chunks_of_one_forward_are_two_branches():
    # FixMatch's single forward over both views: the softmax and the log-softmax read two
    # outputs of one split node, which must not pass for one distribution (an entropy)
    def loss(m):
        x = torch.randn(6, 4)
        weak, strong = m(torch.cat([x, x + 0.5])).chunk(2)
        q = torch.softmax(weak, -1)
        mask = q.max(-1)[0].ge(0.0).float()
        return (-(q * F.log_softmax(strong, -1)).sum(-1) * mask).mean()
    assert _forms(_net(), loss) == [("target_grad", "hand-written cross-entropy")]


def test_a_gated_target_and_a_sigmoid_target_are_recorded():
    def gated(m):
        x = torch.randn(6, 4)
        probs = m(x).softmax(1)
        target = torch.where(probs.max(1).values[:, None] > 0.3, probs, torch.full_like(probs, 1 / 3))
        return -(target * m(x - 1).log_softmax(1)).sum(1).mean()

    def binary(m):
        x = torch.randn(6, 4)
        t = torch.sigmoid(m(x))
        z = m(x + 1)
        return -(t * F.logsigmoid(z) + (1 - t) * F.logsigmoid(-z)).mean()
    def ratio(m):
        x = torch.randn(6, 4)
        p_t, p_s = F.softmax(m(x), 1), F.softmax(m(x + 1), 1)
        return (p_t * torch.log(p_t / p_s)).sum(1).mean()  # KL(p_t || p_s) by hand
    assert _forms(_net(), ratio) == [("target_grad", "hand-written cross-entropy")]
    assert _forms(_net(), gated) == [("target_grad", "hand-written cross-entropy")]
    assert _forms(_net(), binary) == [("target_grad", "hand-written cross-entropy")]


def test_squared_errors_and_cosines_between_layers_are_recorded():
    encoder, head = nn.Linear(4, 3), nn.Linear(3, 3)
    model = nn.Sequential(encoder, head)

    def squared(m):
        x = torch.randn(5, 4)
        return ((head(encoder(x)) - encoder(x + 1)) ** 2).sum(1).mean()

    def cosine(m):
        x = torch.randn(5, 4)
        return -F.cosine_similarity(head(encoder(x)), encoder(x + 1), dim=-1).mean()
    def distance(m):
        x = torch.randn(5, 4)
        return (head(encoder(x)) - encoder(x + 1)).norm(dim=1).mean()

    def huber(m):
        x = torch.randn(5, 4)
        d = head(encoder(x)) - encoder(x + 1)
        return torch.where(d.abs() < 1, 0.5 * d ** 2, d.abs() - 0.5).mean()
    for loss in (squared, distance, huber):
        assert _forms(model, loss) == [("target_grad", "hand-written squared error")], loss.__name__
    assert _forms(model, cosine) == [("target_grad", "hand-written cosine similarity")]


def test_hand_written_look_alikes_are_not_recorded():
    def entropy(m):
        z = m(torch.randn(6, 4))
        p = F.softmax(z, 1)
        return -(p * F.log_softmax(z, 1)).sum(1).mean() - (p * torch.log(p + 1e-8)).sum(1).mean()

    def entropy_of_two_calls(m):
        # the same input through the same layers twice, no dropout: one distribution
        x = torch.randn(6, 4)
        return -(F.softmax(m(x), -1) * F.log_softmax(m(x), -1)).sum(-1).mean()

    def r_drop(m):
        x = torch.randn(6, 4)
        lp1, lp2 = F.log_softmax(m(x + 0.1), 1), F.log_softmax(m(x - 0.1), 1)
        return ((lp1.exp() * (lp1 - lp2)).sum(1) + (lp2.exp() * (lp2 - lp1)).sum(1)).mean()

    def pi_model(m):
        x = torch.randn(6, 4)
        return ((F.softmax(m(x + 0.1), 1) - F.softmax(m(x - 0.1), 1)) ** 2).sum(1).mean()

    def detached(m):
        x = torch.randn(6, 4)
        q = F.softmax(m(x), 1).detach()
        return (-(q * F.log_softmax(m(x + 1), 1)).sum(1).mean()
                - F.cosine_similarity(m(x), m(x + 1).detach()).mean())

    def advantage(m):
        x, a = torch.randn(6, 4), torch.randint(0, 3, (6, 1))
        out = m(x)
        # a log-likelihood weighted by a computed value that is no distribution: the policy
        # gradient's advantage is advantage-not-detached's, not a target
        return -(torch.log(F.softmax(out, 1).gather(1, a)) * (1.0 - out[:, :1])).mean()

    def rows_of_one_output(m):
        h = torch.relu(m(torch.randn(8, 4)))  # no weight next to the rows compared
        return (h[:4] - h[4:]).norm(dim=1).mean() + F.mse_loss(h[1:], h[:-1])

    def pairwise(m):
        s = m(torch.randn(6, 4))[:, 0]
        return ((s[:, None] - s[None, :]) ** 2).mean()

    def contrastive(m):
        z1, z2 = m(torch.randn(6, 4)), m(torch.randn(6, 4))
        return -(torch.eye(6) * F.log_softmax(z1 @ z2.t(), 1)).sum(1).mean()

    def gaussian_kl(m):
        # a KL between a posterior and a learned prior that share a trunk (a VRNN): a
        # likelihood term with a learned variance trains both sides on purpose
        h = m[1](m[0](torch.randn(6, 4)))
        prior, post = nn.functional.linear(h, m[2].weight), m[2](h)
        logvar = prior[:, :1]
        return (0.5 * ((post - prior) ** 2 / logvar.exp() + logvar)).sum(1).mean()

    def triplet(m):
        # two towers sharing a layer: a query pulled to its document, pushed from another
        shared, q_head, d_head = m[0], nn.Linear(8, 3), nn.Linear(8, 3)
        q = F.normalize(q_head(torch.relu(shared(torch.randn(6, 4)))), dim=1)
        pos = F.normalize(d_head(torch.relu(shared(torch.randn(6, 4)))), dim=1)
        neg = F.normalize(d_head(torch.relu(shared(torch.randn(6, 4)))), dim=1)
        return (-(q * pos).sum(1) + (q * neg).sum(1)).mean()

    for loss in (rows_of_one_output, triplet, entropy, entropy_of_two_calls, r_drop, pi_model, detached, advantage, pairwise, contrastive, gaussian_kl):
        assert _read(_net(), loss) == [], loss.__name__


def test_a_built_in_losss_own_pieces_are_left_to_its_call():
    # kl_div and cross_entropy with probabilities compute target * log-probability inside:
    # judged once, at the call, not again at the backward
    m = _net()
    rec = _Rec(list(m.parameters()))
    watcher = TargetGradWatcher(rec)
    x = torch.randn(5, 4)
    logp, q = F.log_softmax(m(x + 1), 1), F.softmax(m(x), 1)
    watcher._called.add(q.grad_fn)
    watcher._calls += 1
    watcher._check("kl_div", logp, q)
    watcher.describe_loss(F.kl_div(logp, q, reduction="batchmean"))
    assert [data["fn"] for _, data in rec.events] == ["kl_div"]
    # with log_target the target enters exp'd, the input itself is multiplied
    rec = _Rec(list(m.parameters()))
    watcher = TargetGradWatcher(rec)
    logq = F.log_softmax(m(x - 1), 1)
    watcher._called.update((logp.grad_fn, logq.grad_fn))
    watcher._calls += 1
    watcher._check("kl_div", logp, logq)
    watcher.describe_loss(F.kl_div(logp, logq, reduction="batchmean", log_target=True))
    assert [data["fn"] for _, data in rec.events] == ["kl_div"]


def test_the_graph_helpers_of_the_hand_written_forms():
    from graddoctor.instrument.stopgrad import branch, comparisons, is_distribution, log_terms
    m = _net()
    x = torch.randn(3, 4)
    z = m(x)
    soft, logsoft = F.softmax(z / 2.0, 1), F.log_softmax(z, 1)
    edge = lambda t: (t.grad_fn, t.output_nr)  # noqa: E731
    assert branch(edge(soft)) == branch(edge(logsoft)) == (z.grad_fn, 0)
    a, b = m(torch.cat([x, x])).chunk(2)
    assert branch(edge(F.softmax(a, 1))) != branch(edge(F.softmax(b, 1)))
    assert [type(n).__name__ for n, _ in log_terms(edge(logsoft - torch.log(soft)))] \
        == ["LogBackward0", "LogSoftmaxBackward0"]
    assert log_terms(edge(z)) == []
    assert is_distribution(edge(torch.where(z > 0, soft, torch.zeros_like(soft))))
    assert not is_distribution(edge(z - 1.0))
    assert comparisons((z * z.detach()).sum().grad_fn) == []
    # one distribution on both sides is judged no target on its own, before any pairing
    watcher = TargetGradWatcher(_Rec(list(m.parameters())))
    assert watcher._judge("kl_div", edge(logsoft), edge(soft), True) is None
    assert watcher._judge("kl_div", edge(F.log_softmax(b, 1)), edge(F.softmax(a, 1)), True) is not None


def test_the_line_that_computes_a_hand_written_comparison_is_found(tmp_path):
    from graddoctor.analysis.source import comparison_line
    script = tmp_path / "train.py"
    script.write_text(
        "def soft_ce(logits, target):\n"
        "    return -(target * logits.log_softmax(1)).sum(1).mean()\n"
        "\n"
        "for step in range(3):\n"
        "    q = model(x).softmax(1)\n"
        "    unsup = soft_ce(model(x2), q)\n"
        "    err = ((pred - encoder(x3)) ** 2).sum(1)\n"
        "    cos = -F.cosine_similarity(p, z).mean()\n"
        "    dist = torch.linalg.norm(a - b, dim=1)\n"
        "    loss = unsup + err.mean() + cos + dist.mean()\n"
        "    loss.backward()\n")
    assert comparison_line(str(script), 11, "cross-entropy") == \
        (2, "return -(target * logits.log_softmax(1)).sum(1).mean()", "target")
    assert comparison_line(str(script), 11, "squared error")[::2] == (9, "b")  # the nearest above
    assert comparison_line(str(script), 11, "cosine similarity")[::2] == (8, "z")
    assert comparison_line(str(script), 10, "cross-entropy") is None  # line 10 backpropagates nothing
    script.write_text("for step in range(3):\n"
                      "    td = q(s).gather(1, a) - (r + 0.9 * q(s2).max(1)[0])\n"
                      "    loss = (td ** 2).mean()\n"
                      "    scaler.scale(loss).backward()\n")
    assert comparison_line(str(script), 4, "squared error") == \
        (2, "td = q(s).gather(1, a) - (r + 0.9 * q(s2).max(1)[0])", "r + 0.9 * q(s2).max(1)[0]")


def test_the_rule_points_at_the_hand_written_comparison(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("q = f(x).softmax(1)\n"
                      "loss = -(q * f(x2).log_softmax(1)).sum(1).mean()\n"
                      "loss.backward()\n")
    from graddoctor.trace import TraceBuilder
    t = TraceBuilder(path=str(script))
    t.optimizer(0, [0, 1], line=1, cls="SGD")
    t.put(ev.target_grad(fn="hand-written cross-entropy", params=[0, 1], input_op="LogSoftmaxBackward0",
                         target_op="SoftmaxBackward0"), line=3)
    t.clear([0, 1], line=3)
    t.backward(fresh=[0, 1], line=3)
    t.step(0, line=3)
    f = only(t, SLUG)
    assert f.location.line == 2 and f.evidence["target"] == "q"
    assert "q.detach()" in f.fix


def test_a_residual_of_the_models_derivatives_is_not_but_its_output_against_itself_is():
    # u_t - k * u_xx and du - u * (1 - u): an equation's terms, made by autograd.grad with
    # create_graph=True; the same output compared with a bootstrapped copy of itself still is
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

    def residuals(m, run):
        xt = torch.rand(6, 2, requires_grad=True)
        u = m(xt)
        grads = torch.autograd.grad(u, xt, torch.ones_like(u), create_graph=True)[0]
        u_x, u_t = grads[:, 0:1], grads[:, 1:2]
        u_xx = torch.autograd.grad(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, 0:1]
        run("mse_loss", u_t, 0.1 * u_xx)
        run("mse_loss", u_x, u * (1 - u))
    assert _judge(net, residuals) == []

    def bootstrapped(m, run):
        xt = torch.rand(6, 2)
        run("mse_loss", m(xt), 0.9 * m(xt + 1))
    assert [made[0] for made in _judge(net, bootstrapped)] == ["target_grad"]


def _judge_backward(model, losses):
    """As ``_judge``, the loss calls made through the watcher's wrapper of each loss and the
    backward given the loss that ``losses`` returns (None: a backward without a graph)."""
    rec = _Rec(list(model.parameters()))
    watcher = TargetGradWatcher(rec)
    wrapped = {name: watcher._wrap(getattr(F, name), name) for name in ("kl_div", "cross_entropy")}
    loss = losses(model, wrapped)
    watcher.describe_loss(loss)
    return rec.events


def test_a_target_also_fitted_to_labels_is_not_recorded_and_one_that_is_not_is():
    def trades(m, f):  # the clean prediction: the KL's target and the cross-entropy's input
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        natural = f["cross_entropy"](m(x), y)
        robust = f["kl_div"](F.log_softmax(m(x + 0.1), 1), F.softmax(m(x), 1), reduction="sum")
        return natural + robust

    def unlabeled(m, f):  # the labels are of another batch: nothing anchors the weak view
        x, y, u = torch.randn(6, 4), torch.randint(0, 3, (6,)), torch.randn(6, 4)
        natural = f["cross_entropy"](m(x), y)
        robust = f["kl_div"](F.log_softmax(m(u + 0.1), 1), F.softmax(m(u), 1), reduction="sum")
        return natural + robust

    assert _judge_backward(_net(), trades) == []
    assert [made[0] for made in _judge_backward(_net(), unlabeled)] == ["target_grad"]


def test_a_loss_the_backward_does_not_reach_is_not_recorded():
    def attack_then_train(m, f):
        x = torch.randn(6, 4)
        x_adv = (x + 0.1).requires_grad_()
        attack = f["kl_div"](F.log_softmax(m(x_adv), 1), F.softmax(m(x), 1), reduction="sum")
        torch.autograd.grad(attack, [x_adv])  # differentiated with respect to the input only
        return m(x).pow(2).mean()

    def train(m, f):
        x = torch.randn(6, 4)
        return f["kl_div"](F.log_softmax(m(x + 0.1), 1), F.softmax(m(x), 1), reduction="sum")

    assert _judge_backward(_net(), attack_then_train) == []
    assert [made[0] for made in _judge_backward(_net(), train)] == ["target_grad"]


def test_a_balance_residual_between_log_probabilities_trains_both_sides():
    """A GFlowNet's detailed balance (log F(s) + log PF against log F(s') + log PB, one trunk)
    and a path-consistency residual (V(s) + tau * log pi against r + gamma * V(s')) are
    equations trained through every term; the same squares with a value predicted on the first
    side (a bootstrapped regression, an entropy bonus on the target side) keep their target."""
    def balance(m, run):
        s, s2 = torch.randn(6, 4), torch.randn(6, 4)
        a = torch.randint(0, 2, (6, 1))
        out, out2 = m(s), m(s2)
        log_pf = F.log_softmax(out[:, :2], -1).gather(1, a).squeeze(1)
        log_pb = F.log_softmax(out2[:, :2], -1).gather(1, a).squeeze(1)
        run("mse_loss", out[:, 2] + log_pf, out2[:, 2] + log_pb)

    def consistency(m, run):
        s, s2 = torch.randn(6, 4), torch.randn(6, 4)
        log_pi = F.log_softmax(m(s)[:, :2], -1)[:, 0]
        run("mse_loss", m(s)[:, 2] + 0.1 * log_pi, 1.0 + 0.9 * m(s2)[:, 2])

    def soft_td(m, run):
        s, s2 = torch.randn(6, 4), torch.randn(6, 4)
        log_pi = F.log_softmax(m(s2)[:, :2], -1)[:, 0]
        run("mse_loss", m(s)[:, 2], 1.0 + 0.9 * (m(s2)[:, 2] - 0.2 * log_pi))

    assert _judge(_net(), balance) == []
    assert _judge(_net(), consistency) == []
    assert [made[0] for made in _judge(_net(), soft_td)] == ["target_grad"]


def test_a_path_consistency_with_the_log_probability_beside_the_reward_trains_both_sides():
    """PCL written as V(s) against r - tau * log pi(a|s) + gamma * V(s'): the log-probability
    of the policy at the states the value reads sits on the target side, a consistency trained
    through every term. An entropy bonus of the next state (soft Q-learning) stays a target."""
    def pcl(m, run):
        s, s2 = torch.randn(6, 4), torch.randn(6, 4)
        log_pi = F.log_softmax(m(s)[:, :2], -1)[:, 0]
        run("mse_loss", m(s)[:, 2], 1.0 - 0.1 * log_pi + 0.9 * m(s2)[:, 2])

    def next_state_bonus(m, run):
        s, s2 = torch.randn(6, 4), torch.randn(6, 4)
        log_pi = F.log_softmax(m(s2)[:, :2], -1)[:, 0]
        run("mse_loss", m(s)[:, 2], 1.0 - 0.1 * log_pi + 0.9 * m(s2)[:, 2])

    assert _judge(_net(), pcl) == []
    assert [made[0] for made in _judge(_net(), next_state_bonus)] == ["target_grad"]
