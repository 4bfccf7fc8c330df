"""loss-maximised (GD127): what the backward watcher notes of a negated loss function
(instrument/lossfactor.py ``negated_criterion``), and the rule over hand-written traces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graddoctor.findings import Severity
from graddoctor.instrument.lossfactor import may_be_negated, negated_criterion
from rule_traces import builder, findings, only

SLUG = "loss-maximised"

X = torch.randn(4, 3, requires_grad=True)
Y = torch.randint(0, 3, (4,))
T = torch.rand(4, 3)


@pytest.mark.parametrize("loss, node", [
    (lambda: -F.cross_entropy(X, Y), "NllLossBackward0"),
    (lambda: F.mse_loss(X, T) * -1.0, "MseLossBackward0"),
    (lambda: F.mse_loss(X, T) / -2, "MseLossBackward0"),
    (lambda: -0.5 * F.binary_cross_entropy_with_logits(X, T), "BinaryCrossEntropyWithLogitsBackward0"),
    (lambda: -(2.0 * F.smooth_l1_loss(X, T)), "SmoothL1LossBackward0"),
    (lambda: 1 - F.mse_loss(X, T), "MseLossBackward0"),
    (lambda: -(F.cross_entropy(X, Y) + 1.0), "NllLossBackward0"),
    (lambda: 1 / F.mse_loss(X, T), "1/MseLossBackward0"),
    (lambda: 1.0 / (F.cross_entropy(X, Y) + 1e-6), "1/NllLossBackward0"),
    (lambda: torch.reciprocal(F.mse_loss(X, T)), "1/MseLossBackward0"),
])
def test_a_loss_function_times_a_negative_constant_is_named(loss, node):
    value = loss()
    assert may_be_negated(value) and negated_criterion(value) == node


@pytest.mark.parametrize("loss", [
    lambda: F.cross_entropy(X, Y),  # not negated
    lambda: -(-F.cross_entropy(X, Y)),  # negated twice
    lambda: F.cross_entropy(X, Y) * 0.5,
    lambda: -X.log_softmax(1).gather(1, Y[:, None]).mean(),  # a log-likelihood by hand
    lambda: -(F.cross_entropy(X, Y) - X.pow(2).mean()),  # a negated sum of terms
    lambda: F.cross_entropy(X, Y) - 0.1 * F.mse_loss(X, T),  # one negated term
    lambda: -F.cross_entropy(X, Y) * X.sum(),  # a computed factor
    lambda: -F.cosine_similarity(X, T).mean(),  # a similarity
    lambda: 1 / (-F.mse_loss(X, T)),  # the reciprocal of a negated loss grows with the loss
    lambda: F.mse_loss(X, T) - 1.0,
    lambda: F.mse_loss(X, T) / F.mse_loss(torch.zeros_like(T), T).detach(),  # a baseline
    lambda: 1.0 / (X.sigmoid().mean() + 1e-6),  # the reciprocal of a score
])
def test_anything_else_is_not(loss):
    assert negated_criterion(loss()) is None


def _trace(negated=(True, True, True), optimizers=1):
    t = builder(params=[0, 1])
    for opt in range(1, optimizers):
        t.optimizer(opt, [2], line=2)
    for flag in negated:
        t.clear([0, 1], line=10)
        extra = {"loss_negated": "NllLossBackward0"} if flag else {}
        t.backward(fresh=[0, 1], line=11, **extra)
        t.step(0, line=12)
    return t


def test_every_update_of_the_only_optimizer_on_a_negated_loss_is_a_warning():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert f.evidence == {"criterion": "NllLossBackward0", "optimizer": 0}
    assert "negative of cross-entropy" in f.message


def test_silent_with_a_second_optimizer_on_some_updates_only_or_on_one_update():
    assert findings(_trace(optimizers=2), SLUG) == []  # a player of a minimax game
    assert findings(_trace(negated=(True, False, True)), SLUG) == []
    assert findings(_trace(negated=(True,)), SLUG) == []


def test_closure_steps_count_as_the_frameworks_steps():
    # Lightning and L-BFGS step with a closure: the backward runs inside the step
    t = builder(params=[0, 1])
    for _ in range(3):
        t.clear([0, 1], line=10)
        t.backward(fresh=[0, 1], line=11, loss_negated="NllLossBackward0")
        t.step(0, line=12, closure=True)
    assert only(t, SLUG).evidence == {"criterion": "NllLossBackward0", "optimizer": 0}


def test_the_loss_assignment_is_found_from_each_way_of_backpropagating(tmp_path):
    from graddoctor.analysis.source import loss_assignment

    script = tmp_path / "train.py"
    script.write_text(
        "def step(model, accelerator, x):\n"
        "    loss = -model(x).mean()\n"
        "    loss.backward()\n"
        "    accelerator.backward(loss)\n"
        "    model.manual_backward(loss)\n"
        "    return loss\n")
    for line in (3, 4, 5, 6):
        assert loss_assignment(str(script), line) == (2, "loss = -model(x).mean()")
    assert loss_assignment(str(script), 2) is None


def test_optimizers_of_successive_phases_are_judged_each_on_its_own():
    t = builder(params=[0, 1, 2])
    t.optimizer(1, [2], line=2)
    for _ in range(3):  # pre-training: optimizer 1 on a plain loss
        t.clear([2], line=20)
        t.backward(fresh=[2], line=21)
        t.step(1, line=22)
    for _ in range(3):  # fine-tuning: optimizer 0 on a negated loss
        t.clear([0, 1], line=10)
        t.backward(fresh=[0, 1], line=11, loss_negated="NllLossBackward0")
        t.step(0, line=12)
    assert only(t, SLUG).evidence == {"criterion": "NllLossBackward0", "optimizer": 0}


def test_optimizers_stepping_between_each_others_steps_stay_silent():
    t = builder(params=[0, 1, 2])
    t.optimizer(1, [2], line=2)
    for _ in range(3):  # a minimax game: the players alternate
        t.clear([2], line=20)
        t.backward(fresh=[2], line=21)
        t.step(1, line=22)
        t.clear([0, 1], line=10)
        t.backward(fresh=[0, 1], line=11, loss_negated="NllLossBackward0")
        t.step(0, line=12)
    assert findings(t, SLUG) == []


# a hand-written log-likelihood of the served labels minimised (instrument/loglikesign.py)

HAND_SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    logp = torch.log_softmax(model(x), dim=1)
    logp_y = logp.gather(1, y[:, None]).squeeze(1)
    loss = (weights[y] * logp_y).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _hand_trace(tmp_path, text=HAND_SCRIPT, optimizers=1):
    from graddoctor import events as ev
    from graddoctor.trace import TraceBuilder

    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0, 1], line=3)
    for opt in range(1, optimizers):
        t.optimizer(opt, [2], line=3)
    t.put(ev.loglik_minimised(picks=1), 8)
    for _ in range(3):
        for opt in range(optimizers):
            t.clear([0, 1] if opt == 0 else [2], line=8)
            t.backward(fresh=[0, 1] if opt == 0 else [2], line=8)
            t.step(opt, line=8)
    return t


def test_a_hand_written_likelihood_minimised_is_a_warning_at_its_unsigned_statement(tmp_path):
    f = only(_hand_trace(tmp_path), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "grows with the log-probability" in f.message
    assert "`loss = -((weights[y] * logp_y).mean())`" in f.fix


def test_players_that_alternate_stay_silent_on_a_hand_written_likelihood(tmp_path):
    assert findings(_hand_trace(tmp_path, optimizers=2), SLUG) == []


def test_the_unsigned_statement_is_found_and_negated_ones_are_not(tmp_path):
    from graddoctor.analysis.logliklines import unsigned_loglik_line

    path = tmp_path / "a.py"
    path.write_text(HAND_SCRIPT)
    assert unsigned_loglik_line(str(path)) == (7, "loss = (weights[y] * logp_y).mean()")
    negated = ("loss = -(weights[y] * logp_y).mean()", "loss = (weights[y] * -logp_y).mean()",
               "loss = 0.0 - (weights[y] * logp_y).mean()")
    for number, fixed in enumerate(negated):
        other = tmp_path / f"fixed{number}.py"
        other.write_text(HAND_SCRIPT.replace("loss = (weights[y] * logp_y).mean()", fixed))
        assert unsigned_loglik_line(str(other)) is None, fixed


L = torch.randn(8, 4, requires_grad=True)
LABELS = torch.randint(0, 4, (8,))


@pytest.mark.parametrize("loss", [
    lambda: L.log_softmax(1).gather(1, LABELS[:, None]).mean(),
    lambda: ((1 - L.softmax(1).gather(1, LABELS[:, None])) ** 2 * L.log_softmax(1).gather(1, LABELS[:, None])).mean(),
    lambda: (torch.rand(8) * L.log_softmax(1)[torch.arange(8), LABELS]).sum() / 8.0,
    lambda: torch.log(L.softmax(-1).gather(1, LABELS[:, None])).mean() + L.pow(2).mean(),
    lambda: -(-L.log_softmax(1).gather(1, LABELS[:, None]).mean()),
])
def test_likelihoods_that_rise_with_the_loss_are_picked_with_a_positive_sign(loss):
    from graddoctor.instrument.loglikesign import holds_labels, signed_picks

    picks = signed_picks(loss().grad_fn)
    assert picks and all(sign > 0 for sign, _ in picks)
    assert any(holds_labels(index, (torch.randn(8, 3), LABELS)) for _, index in picks)


@pytest.mark.parametrize("loss", [
    lambda: -L.log_softmax(1).gather(1, LABELS[:, None]).mean(),
    lambda: F.nll_loss(L.log_softmax(1), LABELS),
    lambda: -((1 - L.softmax(1).gather(1, LABELS[:, None])) ** 2 * L.log_softmax(1).gather(1, LABELS[:, None])).mean(),
    lambda: (torch.randn(8) * L.log_softmax(1)[torch.arange(8), LABELS]).mean(),  # advantages of both signs
    lambda: (L.softmax(1) * L.log_softmax(1)).sum(1).mean(),  # a negative entropy: no pick
])
def test_negated_or_unsigned_likelihoods_are_not(loss):
    from graddoctor.instrument.loglikesign import signed_picks

    assert all(sign < 0 for sign, _ in signed_picks(loss().grad_fn))


def test_the_watcher_needs_the_served_labels_as_its_index():
    from graddoctor.instrument.loglikesign import LogLikelihoodSignWatcher

    class _Rec:
        def __init__(self):
            self.emitted = []

        def emit_aside(self, made, loc=None):
            self.emitted.append(made)

        def here(self):
            return None

        def retire(self, *args):
            pass

        def subscribe(self, *args):
            pass

        def internal_error(self, what, exc):
            raise exc

    rec = _Rec()
    watcher = LogLikelihoodSignWatcher(rec)
    watcher.served(0, 0, 0, (torch.randn(8, 3), LABELS))
    sampled = torch.multinomial(torch.full((8, 4), 0.25), 1)
    while torch.equal(sampled.squeeze(1), LABELS):
        sampled = torch.multinomial(torch.full((8, 4), 0.25), 1)
    watcher.describe_loss(L.log_softmax(1).gather(1, sampled).mean())  # sampled actions: a cost's REINFORCE
    assert rec.emitted == []
    watcher.describe_loss(L.log_softmax(1).gather(1, LABELS[:, None]).mean())
    assert len(rec.emitted) == 1 and rec.emitted[0][0] == "loglik_minimised"
