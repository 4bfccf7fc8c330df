"""loss-compares-with-itself (GD264): a loss that compares a value with itself (identical views,
negatives equal to the positives, a teacher that is the student)."""

from __future__ import annotations

import ast
import copy

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument.samevalue import SameValueWatcher
from graddoctor.rules.loss_compares_with_itself import own_draw, same_lines
from rule_traces import builder, findings, only

SLUG = "loss-compares-with-itself"


class _Rec:
    def __init__(self, params=()):
        from graddoctor.instrument.identities import Identities

        self.tensors = Identities()
        for p in params:
            self.tensors(p)
        self.pid = self.tensors.get
        self.events = []

    def here(self, skip=2):
        return ("backward", 1)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc


def _run(loss_of, modules, steps=3, lr=1e-2):
    """The events the watcher records over ``steps`` Adam steps of ``modules`` with the loss
    ``loss_of(step)``."""
    torch.manual_seed(0)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    rec = _Rec(params)
    watcher = SameValueWatcher(rec)
    opt = torch.optim.Adam(params, lr=lr)
    for step in range(steps):
        loss = loss_of(step)
        watcher.describe_loss(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watcher.after_step(0, opt)
    return rec.events


def _enc(dropout=0.0):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 4))


def _nt_xent(z1, z2, tau=0.2):
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = (z @ z.T / tau).masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    return F.cross_entropy(sim, torch.cat([torch.arange(n, 2 * n), torch.arange(n)]))


def test_identical_views_in_a_contrastive_loss_are_twins():
    enc = _enc()

    def loss(step):
        v = torch.randn(8, 8)
        return _nt_xent(enc(v), enc(v))

    (kind, data), = _run(loss, [enc])
    assert kind == "same_compared" and data["how"] == "twins" and data["op"] == "concatenation"
    assert data["starts"] == ["AddmmBackward0"] and set(data["params"]) == {0, 1, 2, 3}


def test_infonce_matrix_product_of_equal_normalised_views():
    enc = _enc()

    def loss(step):
        x = torch.randn(8, 8)
        z1, z2 = F.normalize(enc(x.flip(-1)), dim=-1), F.normalize(enc(x.flip(-1)), dim=-1)
        return F.cross_entropy(z1 @ z2.T / 0.1, torch.arange(8))

    (kind, data), = _run(loss, [enc])
    assert data["op"] == "matrix product"


def test_two_random_views_and_dropout_passes_are_not():
    enc = _enc()
    assert _run(lambda s: _nt_xent(enc(torch.randn(8, 8)), enc(torch.randn(8, 8))), [enc]) == []
    drop = _enc(dropout=0.2)
    x = torch.randn(8, 8)
    assert _run(lambda s: _nt_xent(drop(x), drop(x)), [drop]) == []


def test_bpr_with_negatives_equal_to_positives_cancels():
    user, item = nn.Embedding(20, 4), nn.Embedding(30, 4)

    def loss(step, same=True):
        u, pos = torch.randint(0, 20, (32,)), torch.randint(0, 30, (32,))
        neg = pos if same else torch.randint(0, 30, (32,))
        eu = user(u)
        return -F.logsigmoid((eu * item(pos)).sum(1) - (eu * item(neg)).sum(1)).mean()

    (kind, data), = _run(loss, [user, item])
    assert data["op"] == "difference" and data["starts"] == ["EmbeddingBackward0"]
    assert _run(lambda s: loss(s, same=False), [user, item]) == []


def test_negatives_equal_in_a_few_rows_only_are_not():
    item = nn.Embedding(30, 4)

    def loss(step):
        pos = torch.randint(0, 30, (32,))
        neg = pos.clone()
        neg[::2] = (pos[::2] + 1) % 30
        return F.relu(1 - (item(pos).sum(1) - item(neg).sum(1))).mean()

    assert _run(loss, [item]) == []


def test_outputs_meeting_in_a_sum_of_terms_or_an_entropy_are_not():
    model = _enc()

    def loss(step):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        entropy = -(F.softmax(model(x), -1) * F.log_softmax(model(x), -1)).sum(-1).mean()
        return F.cross_entropy(model(x), y) + 1e-3 * model(x).pow(2).mean() - 0.01 * entropy

    assert _run(loss, [model]) == []


def test_the_k3_kl_estimator_is_no_comparison_but_a_difference_of_two_passes_is():
    model = _enc()
    reference = _enc().requires_grad_(False)

    def k3(step):
        x = torch.randn(8, 8)
        with torch.no_grad():
            ref = F.log_softmax(reference(x), -1)
        logp = F.log_softmax(model(x), -1)
        return (torch.exp(ref - logp) - (ref - logp) - 1).mean()

    assert _run(k3, [model]) == []

    def twice(step):
        x = torch.randn(8, 8)
        return (F.log_softmax(model(x), -1) - F.log_softmax(model(x), -1)).pow(2).mean()

    assert _run(twice, [model]) != []


def test_a_consistency_kl_between_two_identical_passes_is_found():
    model = _enc()

    def loss(step):
        x = torch.randn(8, 8)
        return F.kl_div(F.log_softmax(model(x), -1), F.softmax(model(x), -1), reduction="batchmean")

    (kind, data), = _run(loss, [model])
    assert data["how"] == "twins" and data["op"] == "kl_div"


def test_a_teacher_that_is_the_student_is_a_constant_twin_after_two_steps():
    student = _enc()

    def loss(step, teacher=student):
        x = torch.randn(8, 8)
        s = student(x)
        with torch.no_grad():
            t = teacher(x)
        return F.kl_div(F.log_softmax(s, 1), F.softmax(t, 1), reduction="batchmean")

    assert _run(loss, [student], steps=1) == []  # one step: a copy is equal then too
    (kind, data), = _run(loss, [student])
    assert data["how"] == "constant" and data["op"] == "kl_div" and data["core"] == "LogSoftmaxBackward0"

    def mse(step):
        x = torch.randn(8, 8)
        return F.mse_loss(student(x), student(x).detach())

    (kind, data), = _run(mse, [student])
    assert data["how"] == "constant" and data["op"] == "mse_loss"


def test_a_copied_or_ema_teacher_is_not():
    student = _enc()
    ema = copy.deepcopy(student).requires_grad_(False)

    def loss(step):
        x = torch.randn(8, 8)
        s = student(x)
        with torch.no_grad():
            t = ema(x)
        out = F.kl_div(F.log_softmax(s, 1), F.softmax(t, 1), reduction="batchmean") + \
            F.mse_loss(F.softmax(s, 1), F.softmax(t, 1))
        with torch.no_grad():
            for a, b in zip(ema.parameters(), student.parameters()):
                a.mul_(0.99).add_(b, alpha=0.01)
        return out

    assert _run(loss, [student], steps=4) == []


def test_the_line_that_made_the_sides_one_is_found_in_the_source():
    text = """
v1 = aug(x)
v2 = v1
neg = pos
z = enc(v1), enc(v2)
score = model(u, pos, neg)
s, t = student(x), teacher(x)
h = x
out = torch.zeros(n, n)
ea, ep, en = net(a), net(p), net(p)
loss = crit(net(xa), net(xa), net(xn))
pair = model(x1, x1)
j = i.clone()
out, _ = self.attn(h, h, h)
y = mha(q, q, q)
teacher = copy.deepcopy(student)
w = f(i, j)
"""
    found = same_lines(ast.parse(text))
    assert [line for line, _ in found] == [3, 4, 10, 11, 12, 13]
    assert found[-1][1] == "j = i.clone()"


def test_a_prediction_given_with_its_own_detached_copy_is_found_and_a_grid_of_literals_is_not():
    text = """
ys, xs = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
c_loss = F.mse_loss(feats[k], feats[k].detach())
ok = F.mse_loss(feats[k], target[k].detach())
"""
    found = same_lines(ast.parse(text))
    assert [line for line, _ in found] == [3]
    assert "feats[k].detach()" in found[0][1]


def test_an_alias_is_told_the_draw_of_its_own():
    tree = ast.parse("pos = torch.randint(0, 9, (4,))\nneg = pos.clone()\nv1 = x\nv2 = v1\n")
    assert own_draw(tree, 2) == "neg = torch.randint(0, 9, (4,))"
    assert own_draw(tree, 4) is None  # v1 was no call: nothing to draw again
    assert own_draw(tree, 1) is None


def _trace(params, stepped=(0, 1), how="twins", op="difference", starts=("EmbeddingBackward0",)):
    t = builder(params=list(stepped))
    t.clear(list(stepped), line=10)
    t.put(ev.same_compared(how=how, op=op, core="SumBackward1", shape=None, params=list(params),
                           starts=list(starts)), line=11)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_in_the_scripts_terms():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 11 and "negative" in f.fix and "cancel" in f.message
    f = only(_trace([0, 1], op="concatenation", starts=("AddmmBackward0",)), SLUG)
    assert "augment" in f.fix and "invariance" in f.message
    f = only(_trace([0, 1], how="constant", op="kl_div", starts=()), SLUG)
    assert "deepcopy" in f.fix and "teacher" in f.message


def test_a_pair_scored_from_two_lookups_of_the_same_rows_is_told_to_index_the_pairs_other_end():
    # link prediction's `z[edges[0]] * z[edges[0]]`: the pair's two ends, not augmented views
    f = only(_trace([0, 1], op="product"), SLUG)
    assert "edges[1]" in f.fix and "augment" not in f.fix and "row with itself" in f.message


def test_parameters_compared_with_an_aliased_anchor_are_left_to_anchor_aliases_params():
    t = _trace([0, 1], how="constant", op="difference", starts=())
    assert len(findings(t, SLUG)) == 1
    t.put(ev.anchor_alias(params=[0, 1], how="shared"), 11)
    assert findings(t, SLUG) == []


def test_the_rule_is_silent_when_no_optimizer_steps_them():
    assert findings(_trace([5]), SLUG) == []


def test_a_graph_saved_under_checkpointing_is_left_alone_without_recomputing_it():
    from torch.utils.checkpoint import checkpoint

    enc = _enc()
    calls = []
    enc.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(8, 8)
    rec = _Rec(list(enc.parameters()))
    watcher = SameValueWatcher(rec)
    for _ in range(3):
        loss = _nt_xent(checkpoint(enc, x, use_reentrant=False), checkpoint(enc, x, use_reentrant=False))
        before = len(calls)
        watcher.describe_loss(loss)
        assert len(calls) == before  # no saved tensor unpacked: the forward was not run again
        loss.backward()
    assert rec.events == []


def test_equal_values_stacked_without_a_product_of_rows_are_not_compared():
    # REINFORCE on a bandit: one state at every step, its log-probabilities stacked and weighted
    policy = _enc()
    state = torch.randn(8)

    def reinforce(step):
        logp = [torch.log_softmax(policy(state), -1)[1] for _ in range(4)]  # one action, 4 steps
        return -(torch.stack(logp) * torch.tensor([1.0, -0.5, 0.2, 0.3])).sum()

    assert _run(reinforce, [policy]) == []

    def stacked_then_compared(step):  # the same stack, then a product of its rows: compared
        v = torch.randn(8, 8)
        z = F.normalize(torch.stack([policy(v), policy(v)]).flatten(0, 1), dim=1)
        return F.cross_entropy(z @ z.T / 0.2, torch.arange(16))

    (kind, data), = _run(stacked_then_compared, [policy])
    assert data["op"] == "stack"


def test_layers_constructed_twice_in_place_are_no_shared_value():
    found = same_lines(ast.parse("enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU())\n"
                                 "loss = coral(fs, fs)\n"))
    assert found == [(2, "fs is passed twice to coral(fs, fs)")]


def test_a_scripts_own_alignment_term_given_one_domain_twice_is_named_at_the_call(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("def coral(a, b):\n    return ((a.T @ a) - (b.T @ b)).pow(2).sum()\n" + "\n" * 8
                    + "loss = task + coral(fs, fs)\n")
    from graddoctor.trace import TraceBuilder

    t = TraceBuilder(str(path))
    t.optimizer(0, [0, 1], line=1)
    t.clear([0, 1], line=10)
    t.put(ev.same_compared(how="twins", op="difference", core="SumBackward1", shape=None,
                           params=[0, 1], starts=["MmBackward0"]), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert f.location.line == 11 and "`coral(fs, fs)` is given `fs`" in f.message
    assert "second argument of `coral`" in f.fix
