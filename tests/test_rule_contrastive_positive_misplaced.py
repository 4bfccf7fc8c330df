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
from rule_traces import builder, findings, only

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
