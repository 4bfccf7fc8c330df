"""contrastive-positive-misplaced (GD173): the targets of a pairwise-similarity loss that do not
point at each row's positive (one label for all rows, labels on a self-similarity's diagonal,
a triplet's positive and negative swapped), read from the graph of the logits."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.source import call_with_swapped, labels_written
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.pairlabels import pair_fault
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only

SLUG = "contrastive-positive-misplaced"
N = 8


def _views(seed=0):
    torch.manual_seed(seed)
    enc = nn.Linear(6, 5)
    x = torch.randn(N, 6)
    return F.normalize(enc(x), dim=1), F.normalize(enc(x + 0.1 * torch.randn_like(x)), dim=1), enc


def _fault(logits, target, fn="cross_entropy"):
    return pair_fault(fn, logits, target, lambda: True)


ZEROS = torch.zeros(N, dtype=torch.long)


@pytest.mark.parametrize("logits_of", [
    lambda a, b: a @ b.T / 0.1,
    lambda a, b: torch.mm(a, b.t()),
    lambda a, b: torch.einsum("nd,md->nm", a, b) / 0.07,
    lambda a, b: torch.bmm(a[None], b.T[None])[0],
    lambda a, b: nn.Parameter(torch.tensor(2.6)).exp() * a @ b.T,  # CLIP's learned scale
    lambda a, b: (a @ b.T).masked_fill(torch.eye(N, dtype=torch.bool), -1e9),
    lambda a, b: a @ b.detach().T,  # keys without a graph, one per sample
    lambda a, b: (a @ b.T).T,
])
def test_one_label_for_every_row_of_a_similarity_of_two_batches_is_found(logits_of):
    a, b, _ = _views()
    assert _fault(logits_of(a, b), ZEROS) == ("constant", 0, None, None)
    assert _fault(logits_of(a, b), torch.full((N,), 3)) == ("constant", 3, None, None)


def test_nll_loss_after_log_softmax_is_followed_to_the_product():
    a, b, _ = _views()
    assert _fault(F.log_softmax(a @ b.T, dim=1), ZEROS, fn="nll_loss") == ("constant", 0, None, None)


def test_labels_on_the_diagonal_of_a_self_similarity_are_found():
    a, b, _ = _views()
    z = torch.cat([a, b])
    assert _fault(z @ z.T / 0.5, torch.arange(2 * N)) == ("self", None, 1.0, True)
    one = F.normalize(a, dim=1)  # one view: no halves to point at each other
    assert _fault(one @ one.T, torch.arange(N)) == ("self", None, 1.0, False)
    half = torch.cat([torch.arange(N), torch.arange(N)])  # the first N rows on themselves
    assert _fault(z @ z.T, half)[0] == "self"
    cosine = F.cosine_similarity(z[:, None], z[None], dim=-1)
    assert _fault(cosine, torch.arange(2 * N)) == ("self", None, 1.0, True)


@pytest.mark.parametrize("case", ["arange", "shifted", "moco_cat", "weight", "normalised_weight",
                                  "per_row", "queue", "soft", "few_rows", "two_tensors_arange",
                                  "permutation"])
def test_targets_that_point_at_each_rows_positive_and_classifiers_stay_silent(case):
    a, b, enc = _views()
    arange = torch.arange(N)
    if case == "arange":
        assert _fault(a @ b.T, arange) is None
    elif case == "shifted":
        z = torch.cat([a, b])
        assert _fault(z @ z.T, torch.cat([arange + N, arange])) is None
    elif case == "moco_cat":
        logits = torch.cat([(a * b).sum(1, keepdim=True), a @ torch.randn(5, 16)], dim=1)
        assert _fault(logits, ZEROS) is None
    elif case == "weight":
        assert _fault(a @ enc.weight, ZEROS[:N]) is None  # (N, 6): x @ W, a parameter
        head = nn.Linear(5, N, bias=False)
        assert _fault(head(a), ZEROS) is None
    elif case == "normalised_weight":
        w = nn.Parameter(torch.randn(N, 5))
        assert _fault(a @ F.normalize(w, dim=1).T, ZEROS) is None
    elif case == "per_row":
        cands = torch.stack([b, b.roll(1, 0), b.roll(2, 0)], dim=1)  # (N, 3, 5), positive first
        assert _fault(torch.bmm(a.unsqueeze(1), cands.transpose(1, 2)).squeeze(1), ZEROS[:N]) is None
    elif case == "queue":
        assert _fault(a @ torch.randn(5, 32), ZEROS) is None  # a table without a graph
    elif case == "soft":
        assert _fault(a @ b.T, torch.eye(N)) is None
    elif case == "few_rows":
        assert _fault(a[:3] @ b[:3].T, ZEROS[:3]) is None
    elif case == "two_tensors_arange":  # arange on z1 @ z2.T is CLIP's, not a self-similarity
        assert _fault(a @ a.detach().T, arange) is None
    elif case == "permutation":
        assert _fault(a @ b.T, arange.roll(1)) is None  # not looked at


def _triplet_events(order: str):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    net = nn.Linear(6, 4)
    x = torch.randn(N, 6)
    with Instrumentation(rec):
        anchor, pos = net(x), net(x + 0.01 * torch.randn_like(x))
        if order == "swapped":
            nn.TripletMarginLoss()(anchor, pos.roll(1, 0), pos).backward()
        elif order == "distance":
            nn.TripletMarginWithDistanceLoss()(anchor, pos.flip(0), pos).backward()
        elif order == "right":
            F.triplet_margin_loss(anchor, pos, pos.roll(1, 0)).backward()
        elif order == "mined":
            idx = torch.randperm(N)
            F.triplet_margin_loss(anchor, anchor[idx.roll(1)], anchor[idx]).backward()
        elif order == "far":  # reordered, but the values say the reordered rows are the nearer
            far = net(torch.randn(N, 6) * 5)
            F.triplet_margin_loss(anchor, pos[torch.arange(N).roll(1)], far).backward()
    return [e for e in rec.trace if e.kind == "pair_labels"]


@pytest.mark.parametrize("order, fn", [("swapped", "triplet_margin_loss"),
                                       ("distance", "triplet_margin_with_distance_loss")])
def test_a_triplet_whose_positive_is_its_negative_reordered_is_recorded(order, fn):
    (e,) = _triplet_events(order)
    assert e["how"] == "triplet" and e["fn"] == fn and e["rows"] == N and e["share"] >= 0.75


@pytest.mark.parametrize("order", ["right", "mined", "far"])
def test_triplets_in_order_or_mined_record_nothing(order):
    assert _triplet_events(order) == []


def test_the_rule_points_at_the_assignment_of_the_labels(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        logits = torch.randn(4, 4)
        labels = torch.zeros(4, dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        other = torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long))
        """))
    assert labels_written(str(script), 4, ("cross_entropy",)) == \
        (3, "labels = torch.zeros(4, dtype=torch.long)", "labels", "logits", True)
    assert labels_written(str(script), 5, ("cross_entropy",)) == \
        (5, "torch.zeros(4, dtype=torch.long)", "torch.zeros(4, dtype=torch.long)", "logits", False)
    assert labels_written(str(script), 2, ("cross_entropy",)) is None


def test_the_rule_reports_each_kind_once_per_line():
    t = builder()
    t.put(ev.pair_labels(how="constant", fn="cross_entropy", rows=16, columns=16, label=0), 14)
    t.put(ev.pair_labels(how="constant", fn="cross_entropy", rows=16, columns=16, label=0), 14)
    f = only(t, SLUG)
    assert f.location.line == 14 and "16x16" in f.message and "arange" in f.fix
    t = builder()
    t.put(ev.pair_labels(how="self", fn="cross_entropy", rows=16, columns=16, share=1.0, halves=True), 9)
    f = only(t, SLUG)
    assert "itself" in f.message and "torch.cat([torch.arange(8, 16), torch.arange(8)])" in f.fix
    assert "second view" not in f.fix
    t = builder()
    t.put(ev.pair_labels(how="self", fn="cross_entropy", rows=16, columns=16, share=1.0, halves=False), 9)
    assert "second view" in only(t, SLUG).fix
    t = builder()
    t.put(ev.pair_labels(how="triplet", fn="triplet_margin_loss", rows=12, columns=12, share=0.9), 7)
    f = only(t, SLUG)
    assert f.location.line == 7 and "swapped" in f.message
    assert findings(builder(), SLUG) == []


@pytest.mark.parametrize("logits_of", [
    lambda a, b: F.cosine_similarity(a[:, None], b[None], dim=-1) / 0.1,
    lambda a, b: (a.unsqueeze(1) * b.unsqueeze(0)).sum(-1),
    lambda a, b: -torch.cdist(a, b),
])
def test_cosine_broadcast_and_distance_similarities_are_followed(logits_of):
    a, b, _ = _views()
    assert _fault(logits_of(a, b), ZEROS) == ("constant", 0, None, None)
    assert _fault(logits_of(a, b), torch.arange(N)) is None


def test_a_broadcast_product_of_a_batch_with_a_weight_stays_silent():
    a, _, _ = _views()
    w = nn.Parameter(torch.randn(N, 5))
    assert _fault(F.cosine_similarity(a[:, None], w[None], dim=-1), ZEROS) is None
    assert _fault(-torch.cdist(a, w), ZEROS) is None


def test_the_triplet_fix_swaps_the_call_as_written(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("loss = crit(net(a), torch.where(m, x, y), pos, margin=0.5)\n")
    assert call_with_swapped(str(script), 1, 1, 2) == (
        "crit(net(a), torch.where(m, x, y), pos, margin=0.5)",
        "crit(net(a), pos, torch.where(m, x, y), margin=0.5)")


# -- MoCo's cat([l_pos, l_neg]) labelled off the positive's column ---------------------------

def _moco(first=True, rowwise="einsum", negatives="einsum"):
    a, b, _ = _views()
    k = b.detach()
    queue = F.normalize(torch.randn(5, 16), dim=0)
    l_pos = (torch.einsum("nc,nc->n", a, k).unsqueeze(-1) if rowwise == "einsum"
             else (a * k).sum(1, keepdim=True))
    l_neg = torch.einsum("nc,ck->nk", a, queue) if negatives == "einsum" else a @ queue
    parts = [l_pos, l_neg] if first else [l_neg, l_pos]
    return torch.cat(parts, dim=1) / 0.07


@pytest.mark.parametrize("rowwise, negatives", [("einsum", "einsum"), ("sum", "mm")])
def test_moco_logits_labelled_with_arange_are_found(rowwise, negatives):
    logits = _moco(rowwise=rowwise, negatives=negatives)
    how, column, share, _ = _fault(logits, torch.arange(N))
    assert (how, column) == ("cat", 0) and share == pytest.approx(1 - 1 / N)
    assert _fault(logits, ZEROS) is None  # MoCo as written


def test_moco_logits_with_the_positive_last_want_the_last_column():
    logits = _moco(first=False)
    assert _fault(logits, ZEROS)[:2] == ("cat", 16)
    assert _fault(logits, torch.full((N,), 16)) is None


def test_a_column_beside_class_scores_is_no_positive():
    a, _, _ = _views()
    background, classes = nn.Linear(5, 1), nn.Linear(5, 6)
    scores = torch.cat([background(a), classes(a)], dim=1)
    assert _fault(scores, torch.arange(N) % 7) is None


def test_the_moco_finding_points_at_the_arange_inside_the_model(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        def forward(q, k):
            logits = torch.cat([q, k], dim=1)
            labels = torch.arange(logits.shape[0], dtype=torch.long)
            return logits, labels
        output, target = forward(a, b)
        loss = torch.nn.functional.cross_entropy(output, target)
        """))
    t = TraceBuilder(str(script))
    t.optimizer(0, P, line=1)
    t.put(ev.pair_labels(how="cat", fn="cross_entropy", rows=16, columns=65, label=0, share=0.94), 7)
    f = only(t, SLUG)
    assert f.location.line == 4 and "column 0" in f.message and "94%" in f.message
    assert "torch.zeros(logits.shape[0], dtype=torch.long)" in f.fix


# -- a triplet of three separately embedded batches, swapped -----------------------------

def _apart_events(order: str, calls: int = 2):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    net = nn.Linear(6, 4)
    x = torch.randn(16, 6) * 3
    with Instrumentation(rec):
        for _ in range(calls):
            anchor = net(x)
            view = net(x + 0.05 * torch.randn_like(x))
            other = net(torch.randn(16, 6) * 3)
            if order == "swapped":
                F.triplet_margin_loss(anchor, other, view).backward()
            elif order == "right":
                F.triplet_margin_loss(anchor, view, other).backward()
            elif order == "random":
                F.triplet_margin_loss(net(torch.randn(16, 6)), net(torch.randn(16, 6)),
                                      net(torch.randn(16, 6))).backward()
    return [e for e in rec.trace if e.kind == "pair_labels"]


def test_a_swapped_triplet_of_separate_batches_is_recorded_at_its_second_call():
    assert _apart_events("swapped", calls=1) == []
    (e,) = _apart_events("swapped")
    assert e["how"] == "triplet-apart" and e["share"] >= 0.9


@pytest.mark.parametrize("order", ["right", "random"])
def test_separate_batches_in_order_or_unstructured_record_nothing(order):
    assert _apart_events(order) == []


def test_the_separate_batches_finding_says_how_it_was_seen(tmp_path):
    t = builder()
    t.put(ev.pair_labels(how="triplet-apart", fn="triplet_margin_loss", rows=32, columns=32,
                         share=0.97), 14)
    f = only(t, SLUG)
    assert "three separately embedded batches" in f.message and "97%" in f.message


_RETURNED = """\
class MoCo(nn.Module):
    def forward(self, q, k):
        logits = torch.cat([l_pos, l_neg], dim=1)
        labels = torch.ones(logits.shape[0], dtype=torch.long)
        return logits, labels

model = MoCo()
for step in range(3):
    output, target = model(x, x)
    loss = criterion(output, target)
"""


def test_labels_made_in_the_forward_that_returns_them_are_found_there(tmp_path):
    from graddoctor.analysis.source import labels_built

    path = tmp_path / "moco.py"
    path.write_text(_RETURNED)
    assert labels_built(str(path), 10) == (
        4, "labels = torch.ones(logits.shape[0], dtype=torch.long)", "labels")
    # a target the loop itself assigns is not followed into the forward
    path.write_text(_RETURNED.replace("    loss = criterion", "    target = y\n    loss = criterion"))
    assert labels_built(str(path), 11) is None
