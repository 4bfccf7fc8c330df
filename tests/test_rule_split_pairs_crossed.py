"""split-pairs-crossed (GD333): the source lookup of datasets built from the inputs of one split
and the labels of another, and the rule on a small script run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.rules.split_pairs_crossed import crossed_pairs, role_and_split
from graddoctor.run.session import run_check

SLUG = "split-pairs-crossed"


def _pairs(code: str):
    return [(line, x, xs, y, ys) for line, _, x, xs, y, ys in crossed_pairs(ast.parse(textwrap.dedent(code)))]


@pytest.mark.parametrize("arg, expected", [
    ("X_train", ("inputs", "train")), ("y_val", ("labels", "val")),
    ("labels[list(valid_idx)]", ("labels", "val")), ("train_images.float()", ("inputs", "train")),
    ("self.test_targets", ("labels", "test")), ("X[idx]", None), ("X_train[val_idx]", None),
    ("x_y_train", None), ("weights_train", None),
])
def test_role_and_split(arg, expected):
    assert role_and_split(ast.parse(arg, mode="eval").body) == expected


def test_crossed_pairs_in_dataset_calls_only():
    found = _pairs("""
        class Rows(torch.utils.data.Dataset):
            pass
        a = TensorDataset(X_val, y_test)
        b = Rows(features[train_idx], targets[test_idx])
        c = TensorDataset(X_train, y_train)
        d = plot(X_train, y_test)
        e = TensorDataset(X_train, X_val, y_train)
    """)
    assert found == [(4, "X_val", "val", "y_test", "test"),
                     (5, "features[train_idx]", "train", "targets[test_idx]", "test")]


def test_the_finding_is_at_the_dataset_with_the_labels_respelled(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        X, y = torch.randn(80, 4), torch.randint(0, 2, (80,))
        X_train, y_train, X_test, y_test = X[:40], y[:40], X[40:], y[40:]
        loader = DataLoader(TensorDataset(X_train, y_test), batch_size=8)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    """))
    report = run_check(CheckOptions(target=str(script)))
    found = [f for f in report.findings if f.rule == SLUG]
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 7 and "`y_train`" in found[0].fix


def _made(src: str):
    import ast as _ast
    from graddoctor.rules.split_pairs_crossed import crossed_in_training
    return [(line, x, y) for line, _, x, _, y, _ in crossed_in_training(_ast.parse(src))]


def test_a_training_loop_that_slices_two_splits_into_one_batch():
    src = ("for i in range(0, n, bs):\n"
           "    xb, yb = X_train[i:i + bs], y_val[i:i + bs]\n"
           "    criterion(model(xb), yb).backward()\n")
    assert _made(src) == [(2, "X_train[i:i + bs]", "y_val[i:i + bs]")]


def test_a_loss_given_the_model_of_one_split_and_the_labels_of_another():
    src = ("for step in range(100):\n"
           "    loss = criterion(self.net(x_tr), y_te)\n"
           "    loss.backward()\n")
    assert _made(src) == [(2, "self.net(x_tr)", "y_te")]


def test_pairs_outside_a_training_loop_count_only_through_zip():
    src = ("acc = score(model(X_train), y_val)\n"
           "pairs = zip(X_train, y_test)\n"
           "for x, y in pairs:\n"
           "    f(x, y).backward()\n")
    assert _made(src) == [(2, "X_train", "y_test")]


def test_one_split_or_both_pairs_stay_silent():
    src = ("for i in range(10):\n"
           "    xb, yb = X_train[i], y_train[i]\n"
           "    fit(X_train, y_train, X_val, y_val)\n"
           "    with torch.no_grad():\n"
           "        v = criterion(model(X_val), y_val)\n"
           "    criterion(model(xb), yb).backward()\n")
    assert _made(src) == []


def test_a_loss_given_a_name_that_holds_the_model_output_of_another_split():
    src = ("for i in range(0, n, bs):\n"
           "    out = net(X_train[i:i + bs])\n"
           "    out = out.squeeze(-1)\n"
           "    loss = crit(out, y_val[i:i + bs])\n"
           "    loss.backward()\n")
    assert _made(src) == [(4, "net(X_train[i:i + bs])", "y_val[i:i + bs]")]


def test_a_name_bound_outside_the_block_or_rebound_to_the_same_split_stays_silent():
    src = ("out = net(X_val)\n"
           "for i in range(0, n, bs):\n"
           "    loss = crit(out, y_train[i:i + bs])\n"
           "    out = net(X_train[i:i + bs])\n"
           "    loss = crit(out, y_train[i:i + bs])\n"
           "    loss.backward()\n"
           "    if i % 100 == 0:\n"
           "        out = net(X_val)\n"
           "    val = crit(out, y_train[i:i + bs])\n")
    assert _made(src) == []


def test_one_table_read_at_one_part_and_another_at_another_whatever_the_names():
    from graddoctor.analysis.reorder import split_parts_crossed
    found = split_parts_crossed(ast.parse(textwrap.dedent("""
        a, b = order[:400], order[400:]
        def batches():
            for s in range(0, 200, 50):
                yield torch.from_numpy(feats[a][s:s + 50]), torch.from_numpy(price[b][s:s + 50])
        def fine():
            return feats[a], price[a], feats[b], price[b]
        def one_part():
            return feats[a], price[a]
    """)))
    assert found == [(5, "price", "b", "feats", "a")]
