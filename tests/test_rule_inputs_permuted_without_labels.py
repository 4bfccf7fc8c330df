"""inputs-permuted-without-labels (GD251): the ``batch_pairing`` events of
instrument/batchpairs.py for a model given a batch's rows in another order than its target's,
and the rule's finding."""

from __future__ import annotations

import itertools

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from batchpair_runs import ce, pairing
from rule_traces import builder, findings, only

SLUG = "inputs-permuted-without-labels"


def test_the_event_is_a_warning_at_the_model_call():
    t = builder()
    t.put(ev.batch_pairing(problem="permuted", fn="cross_entropy", loader=0, input_batch=[0, 3],
                           target_loader=0, target_batch=[0, 3], field="[1]", rows=16), 9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert f.evidence == {"loss": "cross_entropy", "batch": [0, 0, 3], "target_field": "[1]", "rows": 16}
    other = builder()
    other.put(ev.batch_pairing(problem="other-batch", fn="cross_entropy", loader=0, input_batch=[0, 3],
                               target_loader=0, target_batch=[0, 1], field="[1]", rows=16), 9)
    assert findings(other, SLUG) == [] and findings(builder(), SLUG) == []


def test_inputs_permuted_labels_in_the_loader_order():
    def loop(loader, model):
        for x, y in itertools.islice(loader, 3):
            ce(model, x[torch.randperm(len(x))], y)

    assert pairing(loop, shuffle=False) == [("permuted", [0, 0], [0, 0], "[1]")]


def test_silent_on_permutations_that_keep_the_pairs():
    def both(loader, model):
        for x, y in itertools.islice(loader, 3):
            perm = torch.randperm(len(x))
            ce(model, x[perm], y[perm])

    def mixup(loader, model):
        for x, y in itertools.islice(loader, 3):
            perm = torch.randperm(len(x))
            out = model(0.7 * x + 0.3 * x[perm])
            (torch.nn.functional.cross_entropy(out, y) + torch.nn.functional.cross_entropy(out, y[perm])).backward()

    def put_back(loader, model):
        for x, y in itertools.islice(loader, 3):
            order = x[:, 1].argsort()
            out = model(x[order])[order.argsort()]
            torch.nn.functional.cross_entropy(out, y).backward()

    def part(loader, model):  # half the batch: the order says nothing
        for x, y in itertools.islice(loader, 3):
            ce(model, x[torch.randperm(len(x))][:4], y[:4])

    for loop in (both, mixup, put_back, part):
        assert pairing(loop) == [], loop.__name__


def _reordered(text):
    import ast
    import textwrap
    from graddoctor.analysis.reorder import fields_reordered_apart
    return fields_reordered_apart(ast.parse(textwrap.dedent(text)))


def test_a_batch_sorted_by_length_without_its_labels_is_read_from_the_source():
    found = _reordered("""
        for step in range(10):
            feats, lengths, frame_y, clip_y = make_batch(32)
            lengths, order = lengths.sort(descending=True)
            feats = feats[order]
            prob = model(feats, lengths)
            target = F.max_pool1d(frame_y, 2)
            loss = F.binary_cross_entropy(prob, target) + bce(prob.amax(1), clip_y)
            loss.backward()
        """)
    assert found == [(5, "order", ("frame_y", "clip_y"), 8, "frame_y")]


def test_an_inline_shuffle_and_an_argsort_through_index_select_are_seen():
    assert _reordered("""
        while True:
            x, y = synth()
            x = x[torch.randperm(len(x))]
            criterion(net(x), y).backward()
        """) == [(4, "", ("y",), 5, "y")]
    assert _reordered("""
        for x, lengths, y in batches:
            idx = lengths.argsort(descending=True)
            x = x.index_select(0, idx)
            loss = F.cross_entropy(net(x, lengths[idx]), y)
            loss.backward()
        """) == []  # lengths[idx] is read inline, not rebound: the permutation's use is not understood
    assert _reordered("""
        for x, lengths, y in batches:
            idx = lengths.argsort(descending=True)
            x, lengths = x.index_select(0, idx), lengths[idx]
            loss = F.cross_entropy(net(x, lengths), y)
            loss.backward()
        """) == [(4, "idx", ("y",), 5, "y")]


def test_orders_undone_shared_or_copied_are_left_alone():
    together = """
        for step in range(10):
            x, lengths, y = make_batch()
            lengths, order = lengths.sort(descending=True)
            x, y = x[order], y[order]
            loss = F.cross_entropy(net(x, lengths), y)
            loss.backward()
        """
    undone = """
        for step in range(10):
            x, lengths, y = make_batch()
            order = lengths.argsort(descending=True)
            x, lengths = x[order], lengths[order]
            out = net(x, lengths)[order.argsort()]
            loss = F.cross_entropy(out, y)
            loss.backward()
        """
    copied = """
        for step in range(10):
            a, p = make_pairs()
            perm = torch.randperm(len(p))
            n = p[perm]
            F.triplet_margin_loss(f(a), f(p), f(n)).backward()
        """
    no_backward = """
        for step in range(10):
            x, y = make_batch()
            x = x[torch.randperm(len(x))]
            print(F.cross_entropy(net(x), y))
        """
    for text in (together, undone, copied, no_backward):
        assert _reordered(text) == []


def _beside(text):
    import ast
    import textwrap
    from graddoctor.analysis.reorder import reordered_beside_kept
    return reordered_beside_kept(ast.parse(textwrap.dedent(text)))


def test_a_field_rebound_as_it_is_beside_reordered_ones_is_found_in_any_scope():
    assert _beside("""
        def cox(log_h, time, event):
            order = torch.argsort(time, descending=True)
            log_h, event = log_h[order], event
            return log_h, event
        """) == [(4, "order", ("log_h",), ("event",))]
    assert _beside("""
        perm = torch.randperm(n)
        x, t, y = x.index_select(0, perm), t[perm], y
        """) == [(3, "perm", ("x", "t"), ("y",))]
    assert _beside("""
        def f(s, y, m):
            _, idx = torch.sort(s, descending=True)
            s, y, m = s[idx], y, m[idx]
        """) == [(4, "idx", ("s", "m"), ("y",))]


def test_fields_reordered_together_or_kept_apart_from_any_order_are_left_alone():
    assert _beside("""
        def cox(log_h, time, event):
            order = torch.argsort(time, descending=True)
            log_h, event = log_h[order], event[order]
            a, b = a, b
            s, y_sorted = s[order], y[order]
        """) == []
    assert _beside("""
        x, y = x[keep], y          # keep is no permutation made here
        def g(x, y):
            order = x.argsort()
            return x[order], y     # not a rebinding
        """) == []


def test_the_rule_reports_the_statement_with_every_field_in_the_fix(tmp_path):
    script = tmp_path / "cox.py"
    script.write_text("import torch\n"
                      "def loss(h, t, e):\n"
                      "    order = torch.argsort(t, descending=True)\n"
                      "    h, e = h[order], e\n"
                      "    return (h * e).sum()\n")
    t = builder()
    t.path = str(script)
    t.backward(fresh=[0, 1], line=5)
    t.step(0, line=6)
    f = only(t, SLUG)
    assert f.location.line == 4 and "`e`" in f.message
    assert "h, e = h[order], e[order]" in f.fix
def test_a_collate_function_building_fields_in_two_orders_is_read_from_its_source():
    import ast

    from graddoctor.analysis.reorder import collate_fields_apart
    src = ("def collate(batch):\n"
           "    order = sorted(range(len(batch)), key=lambda i: len(batch[i][0]), reverse=True)\n"
           "    seqs = [batch[i][0] for i in order]\n"
           "    lengths = torch.tensor([len(s) for s in seqs])\n"
           "    labels = torch.tensor([y for _, y in batch])\n"
           "    return pad(seqs), lengths, labels\n")
    assert collate_fields_apart(ast.parse(src)) == [(5, "labels", "batch", "order", ("seqs",))]
    # every field in the order, the order returned to put outputs back, a label never returned
    same = src.replace("[y for _, y in batch]", "[batch[i][1] for i in order]")
    assert collate_fields_apart(ast.parse(same)) == []
    assert collate_fields_apart(ast.parse(src.replace("lengths, labels\n", "lengths, labels, order\n"))) == []
    assert collate_fields_apart(ast.parse(src.replace("lengths, labels\n", "lengths\n"))) == []


def test_labels_permuted_beside_inputs_in_the_loader_order():
    def labels_shuffled(loader, model):
        for x, y in itertools.islice(loader, 3):
            ce(model, x, y[torch.randperm(len(y))])

    def labels_sorted(loader, model):
        for x, y in itertools.islice(loader, 3):
            ce(model, x, y.sort().values)

    for loop in (labels_shuffled, labels_sorted):
        assert pairing(loop, classes=3, shuffle=False) == [("labels-permuted", [0, 0], [0, 0], "[1]")]


def test_silent_on_targets_that_keep_the_pairs_or_cannot_be_told_from_a_relabelling():
    def binary(loader, model):  # 0/1 labels in another order read like 1 - y
        for x, y in itertools.islice(loader, 3):
            ce(model, x, y[torch.randperm(len(y))])

    def together(loader, model):  # the outputs reordered with the labels
        for x, y in itertools.islice(loader, 3):
            order = y.argsort()
            torch.nn.functional.cross_entropy(model(x)[order], y[order]).backward()

    def mixup(loader, model):  # y[perm] beside y
        for x, y in itertools.islice(loader, 3):
            perm = torch.randperm(len(x))
            out = model(0.6 * x + 0.4 * x[perm])
            (torch.nn.functional.cross_entropy(out, y) + torch.nn.functional.cross_entropy(out, y[perm])).backward()

    def remapped(loader, model):  # other values, not another order
        for x, y in itertools.islice(loader, 3):
            ce(model, x, (y + 1) % 3)

    assert pairing(binary) == []
    for loop in (together, mixup, remapped):
        assert pairing(loop, classes=3) == [], loop.__name__


def test_labels_permuted_is_reported_at_the_statement_that_reordered_them(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("for x, y in loader:\n"
                      "    out = model(x)\n"
                      "    target = y[y.argsort()]\n"
                      "    loss = F.cross_entropy(out, target)\n")
    t = builder()
    t.path = str(script)
    t.put(ev.batch_pairing(problem="labels-permuted", fn="cross_entropy", loader=0, input_batch=[0, 0],
                           target_loader=0, target_batch=[0, 0], field="[1]", rows=16), 2)
    f = only(t, SLUG)
    assert f.location.line == 3 and "model's call at line 2" in f.message
    assert f.evidence["permuted"] == "labels" and f.severity is Severity.WARNING
    script.write_text("for x, y in loader:\n"
                      "    out = model(x)\n"
                      "    loss = criterion(out, y[torch.randperm(16)])\n")
    assert only(t, SLUG).location.line == 3
    script.write_text("for x, y in loader:\n"
                      "    out = model(x)\n"
                      "    print(out)\n")
    assert only(t, SLUG).location.line == 2  # no loss call found: the model's call


def test_the_reordering_statement_is_found_through_the_target_alone():
    import ast
    from graddoctor.analysis.reorder import target_reordered_at
    src = ("for x, y in loader:\n"            # 1
           "    y = y.flip(0)\n"                # 2
           "    out = model(x)\n"               # 3
           "    loss = F.cross_entropy(out, y)\n")  # 4
    # the output's assignment is the latest of the loss's arguments; the flip is the target's
    assert target_reordered_at(ast.parse(src), 4, 3, "cross_entropy") == 2
    plain = src.replace("y.flip(0)", "y.long()")
    assert target_reordered_at(ast.parse(plain), 4, 3, "cross_entropy") == 4


def test_the_statement_that_reordered_the_input_is_found():
    import ast
    from graddoctor.analysis.reorder import input_reordered_at
    src = ("for x, y in loader:\n"                 # 1
           "    if torch.rand(()) < 0.5:\n"         # 2
           "        x = x.flip(0)\n"                # 3
           "    x = x.float()\n"                    # 4
           "    loss = criterion(model(x), y)\n")   # 5
    # x's latest assignment (line 4) does not reorder: no line is claimed
    assert input_reordered_at(ast.parse(src), 5) is None
    src = src.replace("    x = x.float()\n", "    y = y.long()\n")
    assert input_reordered_at(ast.parse(src), 5) == 3
    inline = ("for x, y in loader:\n"
              "    loss = criterion(model(x[torch.randperm(len(x))]), y)\n")
    assert input_reordered_at(ast.parse(inline), 2) is None
def test_inputs_shuffled_before_the_split_without_their_labels():
    import ast
    import textwrap
    from graddoctor.analysis.reorder import permuted_before_pairing

    def found(code):
        return permuted_before_pairing(ast.parse(textwrap.dedent(code)))

    assert found("""
        X, labels = make_data()
        X = X[torch.randperm(len(X))]
        train = TensorDataset(X[:800], labels[:800])
    """) == [(3, "X", "labels", 4)]
    assert found("""
        def build():
            X, y = load()
            perm = np.random.permutation(len(X))
            X = X[perm]
            return TensorDataset(torch.as_tensor(X[:10]), torch.as_tensor(y[:10]))
    """) == [(5, "X", "y", 6)]
    assert found("""
        X, labels = make_data()
        perm = torch.randperm(len(X))
        X, labels = X[perm], labels[perm]
        negatives = X[torch.randperm(len(X))]
        train = TensorDataset(X[:800], labels[:800], negatives[:800])
        X2, y2 = make_data()
        X2 = X2[torch.randperm(len(X2))]
        y2 = y2[torch.randperm(len(y2))]
        other = TensorDataset(X2, X2)
    """) == []
