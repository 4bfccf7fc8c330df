"""sampled-negatives-pushed-up (GD270): the watcher's lookups, scores and node hooks
(instrument/negsample.py), the split into negatives and positives, and the rule over
hand-written traces."""

from __future__ import annotations

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument import negsample
from graddoctor.rules.sampled_negatives_pushed_up import split
from rule_traces import builder, findings, only

SLUG = "sampled-negatives-pushed-up"


class _Rec:
    def __init__(self):
        self.emitted = []

    def here(self):
        return None

    def emit_aside(self, made, loc=None):
        self.emitted.append(made)


class _Finder:
    def user_frames(self, frame):
        return iter(())


def _watch(loss_of, draws):
    """Run the watcher's look at one backward: ``draws`` are the fresh draws (tensors)."""
    rec = _Rec()
    rec.finder = _Finder()
    w = negsample.NegativeSampleWatcher(rec)
    fresh = [[i, 1, d.reshape(-1).to(torch.int64), ["train.py", 10 + i], "randint"]
             for i, d in enumerate(draws)]
    loss = loss_of()
    w._look(loss.grad_fn, fresh)
    loss.backward()
    w._flush()
    return rec.emitted


def _bpr(swapped):
    torch.manual_seed(0)
    user, item = nn.Embedding(20, 8), nn.Embedding(30, 8)
    u, i, j = torch.randint(0, 20, (16,)), torch.randint(0, 30, (16,)), torch.randint(0, 30, (16,))

    def loss():
        eu = user(u)
        pos, neg = (eu * item(i)).sum(-1), (eu * item(j)).sum(-1)
        return -F.logsigmoid(neg - pos if swapped else pos - neg).mean()
    return loss, [j]


def test_a_swapped_bpr_raises_the_drawn_negative_and_lowers_the_positive():
    loss, draws = _bpr(swapped=True)
    (kind, data), = _watch(loss, draws)
    assert kind == "sampled_scores"
    by_draws = {tuple(s["draws"]): s for s in data["scores"]}
    assert by_draws[(0,)]["up"] == 1.0 and by_draws[()]["up"] == 0.0
    negatives, positives, own = split(data, lambda d: None)
    assert [s["draws"] for s in negatives] == [[0]] and own == {0}


def test_a_right_bpr_lowers_the_drawn_negative():
    loss, draws = _bpr(swapped=False)
    (_, data), = _watch(loss, draws)
    negatives, positives, _ = split(data, lambda d: None)
    assert negatives[0]["up"] == 0.0 and positives[0]["up"] == 1.0


def test_a_distance_of_a_partly_corrupted_batch_is_a_negative():
    torch.manual_seed(0)
    ent, rel = nn.Embedding(40, 6), nn.Embedding(3, 6)
    h, r, t = torch.randint(0, 40, (32,)), torch.randint(0, 3, (32,)), torch.randint(0, 40, (32,))
    drawn = torch.randint(0, 40, (16,))
    t_bad = t.clone()
    t_bad[16:] = drawn

    def loss():
        d_pos = (ent(h) + rel(r) - ent(t)).norm(dim=-1)
        d_neg = (ent(h) + rel(r) - ent(t_bad)).norm(dim=-1)
        return torch.relu(1.0 + d_neg - d_pos).mean()  # swapped
    (_, data), = _watch(loss, [drawn])
    negatives, positives, _ = split(data, lambda d: None)
    assert negatives[0]["orient"] == "dist" and negatives[0]["up"] == 1.0


def test_no_score_without_a_drawn_lookup_and_no_event_for_one_score():
    torch.manual_seed(0)
    user, item = nn.Embedding(20, 8), nn.Embedding(30, 8)
    u, i = torch.randint(0, 20, (16,)), torch.randint(0, 30, (16,))
    other = torch.randint(0, 30, (16,))
    assert _watch(lambda: ((user(u) * item(i)).sum(-1) - 3).pow(2).mean(), [other]) == []
    assert _watch(lambda: ((user(u) * item(i)).sum(-1) - 3).pow(2).mean(), [i]) == []


def _scores(*specs):
    return {"scores": [{"orient": "sim", "op": "SumBackward1", "draws": d, "anchors": a, "up": up,
                        "mass": 1.0, "names": n} for d, a, up, n in specs],
            "draws": {"0": {"loc": ["train.py", 5], "fn": "randint"},
                      "1": {"loc": ["train.py", 6], "fn": "randint"},
                      "2": {"loc": ["train.py", 7], "fn": "randint"}}}


def test_split_uses_names_only_when_every_score_reads_its_own_draw():
    event = _scores(([0, 1], [0, 1], 1.0, ["pos_score"]), ([0, 2], [0, 2], 1.0, ["neg_score"]))
    names = {0: "u", 1: "pos", 2: "neg"}
    negatives, positives, own = split(event, names.get)
    assert negatives[0]["names"] == ["neg_score"] and own == {2}
    assert split(event, {0: "u", 1: "a", 2: "b"}.get) is not None  # the scores' names decide
    unnamed = _scores(([0, 1], [0, 1], 1.0, ["x"]), ([0, 2], [0, 2], 1.0, ["y"]))
    assert split(unnamed, {0: "u", 1: "a", 2: "b"}.get) is None


def test_split_needs_an_anchor_shared_with_a_positive():
    event = _scores(([0], [0, 1], 1.0, ["pred"]), ([], [2, 3], 1.0, ["pair"]))
    assert split(event, lambda d: None) is None


def _trace(ups, line=11):
    t = builder(params=[0, 1])
    for up in ups:
        t.clear([0, 1], line=10)
        t.put(ev.sampled_scores(scores=_scores(([0], [0, 1], up, ["neg"]),
                                               ([], [0, 2], 0.0, ["pos"]))["scores"],
                                draws={"0": {"loc": ["train.py", 5], "fn": "randint"}}, line=line),
              line=line)
        t.backward(fresh=[0, 1], line=line)
        t.step(0, line=12)
    return t


def test_the_rule_warns_when_every_judged_backward_raises_the_negatives():
    f = only(_trace([0.9, 1.0, 0.8]), SLUG)
    assert f.evidence["backwards"] == 3 and f.evidence["negatives"] == ["neg"]


def test_the_rule_is_silent_with_one_backward_or_one_that_lowers_them():
    assert findings(_trace([1.0]), SLUG) == []
    assert findings(_trace([1.0, 0.2, 1.0]), SLUG) == []


def test_drawn_columns_of_one_lookup_are_split_into_a_negative_and_a_positive():
    torch.manual_seed(0)
    item, user = nn.Embedding(50, 8), nn.Embedding(10, 8)
    uid = torch.arange(16) % 10
    nxt = torch.randint(0, 50, (16,))
    sampled = torch.randint(0, 50, (16, 4))
    cand = torch.cat([nxt[:, None], sampled], 1)

    def loss(positive):
        logits = torch.einsum("bd,bkd->bk", user(uid), item(cand))
        labels = torch.zeros(16, 5)
        labels[:, 0] = positive
        labels[:, 1:] = 1 - positive
        return F.binary_cross_entropy_with_logits(logits, labels)
    # the true item labelled 1, the sampled ones 0: negatives lowered; the labels swapped: raised
    for positive, reversed_ in ((1.0, False), (0.0, True)):
        anchored = lambda: loss(positive)  # noqa: E731
        (_, data), = _watch(anchored, [sampled])
        negatives, positives, _ = split(data, lambda d: None)
        assert (negatives[0]["up"] >= 0.6) == reversed_ and positives[0]["draws"] == []


def _graph_links(layout, swapped):
    """A graph network's node embeddings scored for the data's edges and for a drawn edge list
    laid out (2, E) (``neg[0]``) or (E, 2) (``neg[:, 0]``)."""
    torch.manual_seed(0)
    lin = nn.Linear(5, 8)
    x = torch.randn(30, 5)
    edges = torch.randint(0, 30, (2, 24))
    drawn = torch.randint(0, 30, (2, 24) if layout == "rows" else (24, 2))

    def loss():
        z = torch.tanh(lin(x))
        a, b = (drawn[0], drawn[1]) if layout == "rows" else (drawn[:, 0], drawn[:, 1])
        pos, neg = (z[edges[0]] * z[edges[1]]).sum(-1), (z[a] * z[b]).sum(-1)
        labels = torch.cat([torch.zeros(24), torch.ones(24)] if swapped else [torch.ones(24), torch.zeros(24)])
        return F.binary_cross_entropy_with_logits(torch.cat([pos, neg]), labels)
    return loss, [drawn]


def test_one_end_of_a_drawn_edge_list_is_a_drawn_lookup_of_a_graph_networks_rows():
    for layout in ("rows", "columns"):
        loss, draws = _graph_links(layout, swapped=True)
        (_, data), = _watch(loss, draws)
        negatives, positives, _ = split(data, lambda d: None)
        # the positive and the drawn pairs gather rows of one computed z: one anchor
        assert negatives[0]["up"] == 1.0 and positives[0]["up"] == 0.0
        loss, draws = _graph_links(layout, swapped=False)
        (_, data), = _watch(loss, draws)
        negatives, positives, _ = split(data, lambda d: None)
        assert negatives[0]["up"] == 0.0


def _labels_read(tmp_path, text):
    from textwrap import dedent
    from graddoctor.analysis.negative_labels import negatives_labelled_positive
    path = tmp_path / "links.py"
    path.write_text(dedent(text))
    return [(line, roles, labels) for line, _, roles, labels in negatives_labelled_positive(str(path))]


@pytest.mark.parametrize("text, found", [
    ("""\
     scores = torch.cat([score(pos_edges), score(neg_edges)])
     labels = torch.cat([torch.zeros(neg_edges.size(1)), torch.ones(pos_edges.size(1))])
     loss = F.binary_cross_entropy_with_logits(scores, labels)
     """, [(2, "positive, negative", "0, 1")]),
    ("""\
     loss = F.binary_cross_entropy_with_logits(torch.cat([pos_out, neg_out]),
                                               torch.cat([torch.zeros_like(pos_out), torch.ones_like(neg_out)]))
     """, [(1, "positive, negative", "0, 1")]),
    ("""\
     crit = nn.BCEWithLogitsLoss()
     def step(pos_logit, neg_logit):
         return crit(pos_logit, torch.zeros_like(pos_logit)) + crit(neg_logit, torch.ones_like(neg_logit))
     """, [(3, "positive", "0")]),
    ("""\
     y = torch.cat([neg_pred.new_full((n,), 0.0), neg_pred.new_full((n,), 1.0)])
     x = torch.cat([positive_scores, neg_pred]).float()
     l = F.binary_cross_entropy(x, y)
     """, [(1, "positive, negative", "0, 1")]),
    ("loss = F.binary_cross_entropy_with_logits(corrupt_score, torch.ones_like(corrupt_score))\n",
     [(1, "negative", "1")]),
])
def test_binary_labels_built_the_other_way_round_are_read_for_the_line(tmp_path, text, found):
    assert _labels_read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    """\
    scores = torch.cat([score(pos_edges), score(neg_edges)])
    labels = torch.cat([torch.ones(pos_edges.size(1)), torch.zeros(neg_edges.size(1))])
    loss = F.binary_cross_entropy_with_logits(scores, labels)
    """,
    """\
    scores = torch.cat([neg_out, pos_out])
    labels = torch.cat([torch.zeros_like(neg_out), torch.ones_like(pos_out)])
    loss = F.binary_cross_entropy_with_logits(scores, labels)
    """,
    # a generator labels its fakes 1: real/fake are not read as roles
    "g = F.binary_cross_entropy_with_logits(D(fake), torch.ones_like(D(fake)))\n",
    "d = F.binary_cross_entropy_with_logits(torch.cat([real_out, fake_out]), torch.cat([zeros, ones]))\n",
    # names saying both roles, or none; mixed orders; labels that are data
    """\
    scores = torch.cat([s(pos, neg), s(neg, pos)])
    labels = torch.cat([torch.zeros(n), torch.ones(n)])
    loss = F.binary_cross_entropy_with_logits(scores, labels)
    """,
    "loss = F.binary_cross_entropy_with_logits(torch.cat([a, b]), torch.cat([torch.zeros(n), torch.ones(n)]))\n",
    "loss = F.cross_entropy(pos_logits, torch.zeros(n, dtype=torch.long))\n",
    """\
    loss = F.binary_cross_entropy_with_logits(torch.cat([pos_a, neg_a, pos_b]),
                                              torch.cat([torch.zeros(n), torch.ones(n), torch.ones(n)]))
    """,
    "loss = F.binary_cross_entropy_with_logits(torch.cat([pos_s, neg_s]), torch.cat([y_pos, y_neg]))\n",
])
def test_right_orders_gan_targets_and_unnamed_blocks_give_no_line(tmp_path, text):
    assert _labels_read(tmp_path, text) == []


def test_a_draw_read_through_a_noise_table_or_a_pair_arrays_column_is_that_draw():
    import numpy as np
    torch.manual_seed(0)
    table = torch.from_numpy(np.repeat(np.arange(10), np.arange(1, 11)))  # a unigram table
    pairs = torch.randint(0, 10, (50, 2))
    draw = torch.randint(0, 50, (32,))
    fresh = [[7, 1, draw, None, "randint"]]
    tables = [table, pairs]
    assert negsample.NegativeSampleWatcher._through_tables(table[draw], fresh, tables) == [7]
    assert negsample.NegativeSampleWatcher._through_tables(pairs[draw, 1], fresh, tables) == [7]
    # the table's rows at other indices, or a lookup of another size: not that draw
    assert negsample.NegativeSampleWatcher._through_tables(table[(draw + 17) % 50], fresh, tables) == []
    assert negsample.NegativeSampleWatcher._through_tables(table[draw[:16]], fresh, tables) == []
    # a draw past every table's end reads no table
    big = [[8, 1, draw + 100, None, "randint"]]
    assert negsample.NegativeSampleWatcher._through_tables(table[draw], big, tables) == []


def test_the_negatives_term_with_the_positives_sign_is_found_in_the_source():
    import ast

    from graddoctor.rules.sampled_negatives_pushed_up import _negatives_term_unnegated
    right = ("pos = F.logsigmoid(pos_score)\nneg = F.logsigmoid(-1 * neg_score)\n"
             "alt = F.softplus(noise_score)\n")
    assert _negatives_term_unnegated(ast.parse(right)) is None
    assert _negatives_term_unnegated(ast.parse(right.replace("-1 * neg_score", "neg_score"))) == \
        (2, "F.logsigmoid(neg_score)")
    assert _negatives_term_unnegated(ast.parse(right.replace("softplus(noise_score)", "softplus(-noise_score)"))) == \
        (3, "F.softplus(-noise_score)")
    # two reversed terms: no one line to name
    both = right.replace("-1 * neg_score", "neg_score").replace("softplus(noise_score)", "softplus(-noise_score)")
    assert _negatives_term_unnegated(ast.parse(both)) is None


def test_each_roles_own_binary_loss_is_read_from_the_source_without_a_draw(tmp_path):
    from graddoctor.analysis.negative_labels import paired_labels_wrong
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn.functional as F\n"
        "def step(pos_logits, neg_logits, m):\n"
        "    loss = F.binary_cross_entropy_with_logits(pos_logits[m], torch.ones_like(pos_logits[m]))\n"
        "    loss += F.binary_cross_entropy_with_logits(neg_logits[m], torch.ones_like(neg_logits[m]))\n"
        "    return loss\n"
        "def right(pos_logits, neg_logits):\n"
        "    return F.binary_cross_entropy_with_logits(pos_logits, torch.ones_like(pos_logits)) \\\n"
        "        + F.binary_cross_entropy_with_logits(-neg_logits, torch.ones_like(neg_logits))\n"
        "def one_role(neg_logits):\n"
        "    return F.binary_cross_entropy_with_logits(neg_logits, torch.ones_like(neg_logits))\n")
    assert [(line, role, label) for line, _, role, label in paired_labels_wrong(str(script))] == [
        (4, "negative", 1)]
