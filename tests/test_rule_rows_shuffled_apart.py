"""rows-shuffled-apart (GD316): what the source says each random order was applied to, and the
rule over hand-written ``shuffled_apart`` events (the watcher runs in the data fixtures)."""

from __future__ import annotations

import ast
import textwrap

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.rules.rows_shuffled_apart import applied_to
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "rows-shuffled-apart"

SCRIPT = """\
import numpy as np
X = load_x(); Y = load_y()
for epoch in range(3):
    order_x = np.random.permutation(len(X))
    order_y = np.random.permutation(len(Y))
    xs, ys = X[order_x], Y[order_y]
    for i in range(0, len(xs), 100):
        train(xs[i:i + 100], ys[i:i + 100])
"""


def test_what_each_order_is_applied_to():
    tree = ast.parse(SCRIPT)
    assert applied_to(tree, 4) == {"X"} and applied_to(tree, 5) == {"Y"}
    inline = ast.parse("x = x[torch.randperm(len(x))]\nrandom.shuffle(labels)\n")
    assert applied_to(inline, 1) == {"x"} and applied_to(inline, 2) == {"labels"}
    sliced = ast.parse(textwrap.dedent("""\
        def epoch(X, Y):
            perm = torch.randperm(len(X))
            for i in range(0, len(X), 8):
                step(X[perm[i:i + 8]], Y[perm[i:i + 8]])
        """))
    assert applied_to(sliced, 2) == {"X", "Y"}
    assert applied_to(ast.parse("n = len(x)\n"), 1) == set()
    part = ast.parse("xb = X[torch.randperm(n)[:64]]\nidx = torch.randperm(n)[:64]\nyb = Y[idx]\n")
    assert applied_to(part, 1) == {"X"} and applied_to(part, 2) == {"Y"}


def _trace(path, arrays, first_line=4):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=2)
    t.put(ev.shuffled_apart(kind="permutation", length=600, first=[path, first_line], arrays=arrays), 5)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def test_inputs_and_labels_in_two_orders_are_a_warning_at_the_second(tmp_path):
    path = _script(tmp_path)
    f = only(_trace(path, {"X": "rows", "Y": "labels"}), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert f.related[0].location.line == 4
    assert "`Y`" in f.message and "`X`" in f.message and "600 rows" in f.message


def test_two_sets_of_inputs_each_in_its_own_order_are_silent(tmp_path):
    path = _script(tmp_path)
    assert findings(_trace(path, {"X": "rows", "Y": "rows"}), SLUG) == []  # unpaired domains
    assert findings(_trace(path, {}), SLUG) == []  # arrays not told


def test_one_order_applied_to_both_is_silent(tmp_path):
    text = SCRIPT.replace("Y[order_y]", "Y[order_x]")
    path = _script(tmp_path, text)
    assert findings(_trace(path, {"X": "rows", "Y": "labels"}), SLUG) == []


def test_one_array_cut_from_the_order_and_its_pair_from_the_raw_positions():
    import ast as _ast
    from graddoctor.rules.rows_shuffled_apart import cut_apart
    src = ("perm = torch.randperm(n)\n"                    # 1
           "for i in range(0, n, bs):\n"                   # 2
           "    idx = perm[i:i + bs]\n"                    # 3
           "    xb, yb = X[idx], Y[i:i + bs]\n")           # 4
    assert cut_apart(_ast.parse(src)) == [(4, "X", "idx", "Y", "i:i + bs")]
    inline = ("def run(X, Y):\n"
              "    perm = np.random.permutation(len(X))\n"
              "    for s in range(0, len(X), 32):\n"
              "        xb = X[perm[s:s + 32]]\n"
              "        yb = Y[s:s + 32]\n")
    assert cut_apart(_ast.parse(inline)) == [(5, "X", "perm[s:s + 32]", "Y", "s:s + 32")]


def test_one_order_for_both_or_arrays_ordered_then_sliced_stay_silent():
    import ast as _ast
    from graddoctor.rules.rows_shuffled_apart import cut_apart
    for src in (
        "perm = torch.randperm(n)\nfor i in range(0, n, b):\n    idx = perm[i:i + b]\n    xb, yb = X[idx], Y[idx]\n",
        "perm = torch.randperm(n)\nXs, Ys = X[perm], Y[perm]\nfor i in range(0, n, b):\n    xb, yb = Xs[i:i + b], Ys[i:i + b]\n",
        "perm = torch.randperm(n)\nfor i in range(0, n, b):\n    idx = perm[i:i + b]\n    xb, w = X[idx], grid[:b]\n",
        "perm = torch.randperm(n)\nXs = X[perm]\nfor i in range(0, n, b):\n    idx = perm[i:i + b]\n    xb, w = Xs[i:i + b], W[idx]\n",
        "order = torch.arange(n)\nfor i in range(0, n, b):\n    idx = order[i:i + b]\n    xb, yb = X[idx], Y[i:i + b]\n",
        "perm = torch.randperm(n)\nfor i in range(0, n, b):\n    idx = perm[i:i + b]\n    xb = X[idx]\n    if cond:\n        yb = Y[i:i + b]\n",
    ):
        assert cut_apart(_ast.parse(src)) == [], src


def test_the_one_order_finding_points_at_the_raw_slice(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "train.py"
    script.write_text("perm = torch.randperm(n)\n"
                      "for i in range(0, n, bs):\n"
                      "    idx = perm[i:i + bs]\n"
                      "    xb, yb = X[idx], Y[i:i + bs]\n"
                      "    loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=5)
    found = list(find_rule("rows-shuffled-apart")().check(Analysis(t.trace)))
    assert [(f.location.line, f.fix) for f in found] == [(4, "index both with the same rows: `Y[idx]`")]


def test_a_dataset_built_with_one_field_in_a_random_order_is_found():
    import ast as _ast
    from graddoctor.rules.rows_shuffled_apart import fields_permuted_apart
    src = (
        "import torch\n"                                                       # 1
        "order = torch.randperm(10)\n"                                         # 2
        "a = TensorDataset(x, y[order])\n"                                     # 3
        "b = TensorDataset(x[order], y[order])\n"                              # 4
        "c = list(zip(imgs, caps[torch.randperm(10)]))\n"                      # 5
        "def build(x, y):\n"                                                   # 6
        "    sub = torch.randperm(10)[:5]\n"                                   # 7
        "    return PairDataset(x[sub], y[sub]), PairDataset(x, y)\n")         # 8
    found = [(line, shuffled, other) for line, _, shuffled, other in fields_permuted_apart(_ast.parse(src))]
    assert found == [(3, "y[order]", "x"), (5, "caps[torch.randperm(10)]", "imgs")]
