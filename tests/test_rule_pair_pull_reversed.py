"""pair-pull-reversed (GD266): hand-written ``pair_pull`` events, and the watcher's invariant on
real tensors: which gradients over a batch's pairwise matrix move the pairs the wrong way for
the labels compared, and which meeting of the mask the finding points at."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.pairpull import _Labels, _Mark, _Meeting, _from_matrix, judge, pointed
from graddoctor.trace import Location, TraceBuilder
from rule_traces import P, findings, only

SLUG = "pair-pull-reversed"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    dist = torch.cdist(emb, emb)
    same = y[:, None] == y[None, :]
    neg = dist.masked_fill(~same, float("inf")).min(1).values
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _event(how="self", distance=True):
    return ev.pair_pull(how=how, fn="cdist" if distance else "mm", distance=distance,
                        shape=[16, 16], same_pairs=64, push_same=0.0156, push_diff=0.0,
                        pull_same=0.01, pull_diff=0.0, matrix_line=5)


def _trace(tmp_path, *made):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=3)
    for item in made:
        t.put(item, 7)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_reversed_pairwise_loss_is_a_warning_at_the_line_to_change(tmp_path):
    f = only(_trace(tmp_path, _event()), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "away from itself" in f.message and "line 5" in f.message
    assert "masked_fill(~same" in f.message
    assert "~same" in f.fix


def test_each_way_of_reversal_says_what_moved(tmp_path):
    f = only(_trace(tmp_path, _event("both", distance=False)), SLUG)
    assert "on net" in f.message and "matrix product" in f.message
    f = only(_trace(tmp_path, _event("pull_diff")), SLUG)
    assert "pulls only pairs whose labels differ" in f.message


def test_one_finding_per_line(tmp_path):
    assert len(findings(_trace(tmp_path, _event(), _event("both")), SLUG)) == 1


def _pk(p=4, k=4):
    return torch.arange(p).repeat_interleave(k)


def _grad_of(loss_of_dist, emb):
    dist = torch.cdist(emb, emb)
    dist.retain_grad()
    loss_of_dist(dist).backward()
    return dist.grad


def test_batch_hard_mining_right_is_not_reversed_and_its_negative_among_the_same_labels_is():
    torch.manual_seed(0)
    y = _pk()
    same = y[:, None] == y[None, :]
    emb = F.normalize(torch.randn(16, 8), dim=1).requires_grad_()

    def right(dist):
        pos = (dist * same.float()).max(1).values
        neg = dist.masked_fill(same, float("inf")).min(1).values
        return F.relu(pos - neg + 5.0).mean()

    def wrong(dist):
        pos = (dist * same.float()).max(1).values
        neg = dist.masked_fill(~same, float("inf")).min(1).values  # the sample itself
        return F.relu(pos - neg + 0.5).mean()

    assert judge(_grad_of(right, emb), same, True, True)[0] is None
    how, _, wrong_pairs = judge(_grad_of(wrong, emb), same, True, True)
    assert how == "self" and bool(wrong_pairs.diagonal().all())


def test_a_swapped_contrastive_convention_is_reversed_and_either_consistent_one_is_not():
    torch.manual_seed(1)
    a = torch.randint(0, 4, (24,))
    b = torch.where(torch.rand(24) < 0.5, a, torch.randint(0, 4, (24,)))
    labels = _Labels(a, b, outer=False)
    same = labels.same()
    d = (torch.rand(24) * 2).requires_grad_()

    def grad(loss):
        d.grad = None
        loss.backward()
        return d.grad

    sim = same.float()
    similar = grad((sim * d.pow(2) + (1 - sim) * F.relu(1.5 - d).pow(2)).mean())
    dissimilar = grad(((1 - (1 - sim)) * d.pow(2) + (1 - sim) * F.relu(1.5 - d).pow(2)).mean())
    swapped = grad(((1 - sim) * d.pow(2) + sim * F.relu(1.5 - d).pow(2)).mean())
    assert judge(similar, same, True, False)[0] is None
    assert judge(dissimilar, same, True, False)[0] is None
    assert judge(swapped, same, True, False)[0] == "both"


def test_supcon_right_is_silent_inverted_is_reversed_on_a_similarity():
    torch.manual_seed(2)
    y = torch.randint(0, 4, (20,))
    same = y[:, None] == y[None, :]
    eye = torch.eye(20, dtype=torch.bool)
    z = F.normalize(torch.randn(20, 8), dim=1)

    def grad(positives):
        s = (z @ z.T).requires_grad_()
        log_prob = F.log_softmax((s / 0.1).masked_fill(eye, -1e9), dim=1)
        pos = (positives & ~eye).float()
        (-((pos * log_prob).sum(1) / pos.sum(1).clamp(min=1)).mean()).backward()
        return s.grad

    assert judge(grad(same), same, False, True)[0] is None
    assert judge(grad(~same), same, False, True)[0] == "both"


def test_a_positive_mined_among_the_other_labels_is_reversed():
    torch.manual_seed(3)
    y = _pk()
    same = y[:, None] == y[None, :]
    emb = F.normalize(torch.randn(16, 8), dim=1).requires_grad_()

    def wrong(dist):
        pos = dist.masked_fill(same, float("-inf")).amax(1)
        neg = dist.masked_fill(same, float("inf")).amin(1)
        return F.softplus(pos - neg).mean()

    assert judge(_grad_of(wrong, emb), same, True, True)[0] == "pull_diff"


def test_too_few_pairs_of_a_side_say_nothing():
    y = torch.arange(8)  # every label once: no same-label pair but the diagonal
    same = y[:, None] == y[None, :]
    assert judge(torch.randn(8, 8), same, True, True) is None
    assert judge(torch.zeros(16, 16), _pk()[:, None] == _pk()[None, :], True, True) is None


def _loc(line):
    return Location("train.py", line)


def test_the_wrong_meeting_is_pointed_at_when_another_meeting_is_right():
    labels = _Labels(_pk(), _pk(), outer=True)
    base = _Mark(labels, ((_loc(6), False),))
    flipped = _Mark(labels, ((_loc(6), False), (_loc(8), True)))
    right, wrong = _Meeting(base, _loc(7), (16, 16)), _Meeting(flipped, _loc(8), (16, 16))
    eye = torch.eye(16, dtype=torch.bool)
    off = (labels.same() & ~eye)
    right.support, wrong.support = off, eye
    assert pointed([right, wrong], eye, off).line == 8


def test_when_every_meeting_is_wrong_the_flip_they_share_is_pointed_at():
    labels = _Labels(_pk(), _pk(), outer=True)
    flipped = _Mark(labels, ((_loc(6), True),))
    again = _Mark(labels, ((_loc(6), True), (_loc(9), True)))
    one, two = _Meeting(flipped, _loc(9), (16, 16)), _Meeting(again, _loc(9), (16, 16))
    wrong = labels.same()
    one.support = two.support = wrong
    assert pointed([one, two], wrong, ~wrong).line == 6
    # no flip: the one line where the mask was applied
    plain = _Mark(labels, ((_loc(6), False),))
    three = _Meeting(plain, _loc(11), (16, 16))
    three.support = wrong
    assert pointed([three], wrong, ~wrong).line == 11
    # no meeting carries the wrong pairs: nothing to point at
    three.support = ~wrong
    assert pointed([three], wrong, torch.zeros_like(wrong)) is None


PROTO_SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    dists = torch.cdist(query_emb, protos) ** 2
    logits = dists
    loss = F.cross_entropy(logits, query_labels)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _class_event():
    return ev.pair_pull(how="both", fn="cdist", distance=True, shape=[25, 5], same_pairs=25,
                        push_same=0.1, push_diff=0.0, pull_same=0.0, pull_diff=0.05,
                        matrix_line=5, classes=True)


def test_class_targets_over_distances_point_at_the_statement_that_makes_the_logits(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(PROTO_SCRIPT)
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=3)
    t.put(_class_event(), 7)  # the cross_entropy's line
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "cross_entropy at line 7" in f.message and "line 5" in f.message
    assert "`logits = dists`" in f.message
    assert "`logits = -dists`" in f.fix and f.evidence["classes"] is True


def _ce_grad(logits_of):
    torch.manual_seed(4)
    query, protos = torch.randn(20, 6), torch.randn(5, 6)
    target = torch.arange(5).repeat_interleave(4)
    d = torch.cdist(query, protos).requires_grad_()
    F.cross_entropy(logits_of(d), target).backward()
    return d.grad, _Labels(target, torch.arange(5), True, classes=True)


def test_class_targets_label_each_row_with_its_column_and_judge_the_sign_of_the_logits():
    grad, labels = _ce_grad(lambda d: -d.pow(2))
    assert not labels.self_pairs() and int(labels.same().sum()) == 20
    assert judge(grad, labels.same(), True, labels.self_pairs())[0] is None
    grad, labels = _ce_grad(lambda d: d / 0.5)
    assert judge(grad, labels.same(), True, labels.self_pairs())[0] == "both"


def test_a_loss_input_counts_as_made_from_the_matrix_through_elementwise_ops_only():
    a = torch.randn(8, 4, requires_grad=True)
    b = torch.randn(5, 4)
    d = torch.cdist(a, b)
    nodes = {id(d.grad_fn): d.grad_fn}
    assert _from_matrix((-(d.pow(2)) / 2.0).grad_fn, nodes) is d.grad_fn
    assert _from_matrix(d.grad_fn, nodes) is d.grad_fn
    assert _from_matrix(torch.log_softmax(-d, dim=1).grad_fn, nodes) is None
    assert _from_matrix((a @ b.t()).grad_fn, nodes) is None
    assert _from_matrix(None, nodes) is None
