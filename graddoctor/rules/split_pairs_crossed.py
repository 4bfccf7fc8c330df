from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from ..analysis.reorder import split_parts_crossed
from ..training_calls import backward_lines
from .base import Rule
from ..analysis.source import walk

_SPLITS = {"train": "train", "training": "train", "tr": "train", "trn": "train",
           "val": "val", "valid": "val", "validation": "val", "dev": "val", "va": "val",
           "test": "test", "testing": "test", "tst": "test", "te": "test"}
_INPUTS = frozenset({"x", "xs", "input", "inputs", "image", "images", "img", "imgs", "feature",
                     "features", "feat", "feats", "sample", "samples", "token", "tokens", "text",
                     "texts", "seq", "seqs", "sequences", "signals", "points"})
_LABELS = frozenset({"y", "ys", "label", "labels", "lbl", "lbls", "target", "targets", "tag",
                     "tags", "classes"})
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def _words(name: str) -> list[str]:
    return [w.lower() for part in name.split("_") for w in _WORDS.findall(part)] or [name.lower()]


def _names(node: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))]


def _split_of(names: list[str]) -> str | None:
    found = {_SPLITS[w] for name in names for w in _words(name) if w in _SPLITS}
    return found.pop() if len(found) == 1 else None


def _base(node: ast.AST) -> ast.AST:
    """``images`` of ``images[idx]``, ``self.images``, ``images.float()``, ``list(x)``' argument."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node


def role_and_split(arg: ast.AST) -> tuple[str, str] | None:
    """``(role, split)`` of one argument: ``X_train`` -> (inputs, train), ``labels[list(val_idx)]``
    -> (labels, val), ``train_labels.float()`` -> (labels, train); None when either is unknown."""
    base = _base(arg)
    if not isinstance(base, (ast.Name, ast.Attribute)):
        return None
    name = base.id if isinstance(base, ast.Name) else base.attr
    words = set(_words(name))
    role = "inputs" if words & _INPUTS else "labels" if words & _LABELS else None
    if role is None or (words & _INPUTS and words & _LABELS):
        return None
    split = _split_of([name])
    if isinstance(arg, ast.Subscript) or (isinstance(_strip(arg), ast.Subscript)):
        index = _split_of(_names(_strip(arg).slice))
        if index is not None:
            if split is not None and split != index:
                return None  # X_train[val_idx]: a name and an index that disagree, not told
            split = index
    return (role, split) if split is not None else None


def _strip(node: ast.AST) -> ast.AST:
    """The subscript under method calls (``labels[idx].float()`` -> ``labels[idx]``)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value
    return node


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def crossed_pairs(tree: ast.AST) -> list[tuple[int, str, str, str, str, str]]:
    """``(line, call text, inputs text, their split, labels text, their split)`` of the dataset
    constructions (a callee named ``...Dataset`` or ``...Set``, or a class of the script
    subclassing a Dataset) given the inputs of one split and the labels of another."""
    datasets = {node.name for node in walk(tree) if isinstance(node, ast.ClassDef)
                and any("Dataset" in ast.unparse(b) for b in node.bases)}
    out = []
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node)
        if not (callee in datasets or callee.lower().endswith(("dataset", "set"))):
            continue
        args = list(node.args) + [k.value for k in node.keywords if k.arg is not None]
        tagged = [(arg, role_and_split(arg)) for arg in args]
        inputs = [(arg, t[1]) for arg, t in tagged if t is not None and t[0] == "inputs"]
        labels = [(arg, t[1]) for arg, t in tagged if t is not None and t[0] == "labels"]
        if len(inputs) != 1 or len(labels) != 1 or inputs[0][1] == labels[0][1]:
            continue
        (x, xs), (y, ys) = inputs[0], labels[0]
        out.append((node.lineno, ast.unparse(node), ast.unparse(x), xs, ast.unparse(y), ys))
    return sorted(out)


def _role_through_call(arg: ast.AST) -> tuple[str, str] | None:
    """``role_and_split`` of an argument, or of the first argument of a call it is (the inputs
    of ``model(X_train[i:j])`` given to a loss)."""
    found = role_and_split(arg)
    if found is None and isinstance(arg, ast.Call) and arg.args and not isinstance(arg.func, ast.Attribute):
        found = role_and_split(arg.args[0])
    if found is None and isinstance(arg, ast.Call) and arg.args and isinstance(arg.func, ast.Attribute) \
            and isinstance(arg.func.value, (ast.Name, ast.Attribute)) and role_and_split(arg.func.value) is None:
        found = role_and_split(arg.args[0])  # self.model(X_train), net.forward(x_tr)
    return found


_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)


def _blocks(tree: ast.AST) -> dict[int, tuple[list, int]]:
    """Each simple statement's block and position in it, by the id of each node it holds."""
    out: dict[int, tuple[list, int]] = {}
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, _SIMPLE):
                    for inner in walk(stmt):
                        out[id(inner)] = (block, i)
    return out


def _binds(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in walk(stmt))


def _model_output(name: str, block: list, at: int) -> ast.AST | None:
    """The call a name holds at position ``at`` of its block, by the statements before it in
    that block: ``out = net(X_train[i:j])``, through the name's own tensor methods after it
    (``preds = preds.squeeze(-1)``); None when the binding is elsewhere or anything else."""
    for stmt in reversed(block[:at]):
        if not _binds(stmt, name):
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return None
        value = stmt.value
        if isinstance(_base(value), ast.Name) and _base(value).id == name:
            at = block.index(stmt)
            return _model_output(name, block, at)
        return value if isinstance(value, ast.Call) else None
    return None


def crossed_in_training(tree: ast.AST) -> list[tuple[int, str, str, str, str, str]]:
    """Like ``crossed_pairs``, for the pairs a training loop makes itself: in a loop whose body
    calls ``backward()``, a tuple (``xb, yb = X_train[i:j], y_val[i:j]``) or a call (a loss
    given ``model(X_tr)`` and ``y_te``, ``zip(x_train, y_test)``) with exactly one element or
    argument of inputs and one of labels, of two splits; and a ``zip`` of such arrays anywhere.
    A loss's argument that is a bare name stands for the model call it was assigned from earlier
    in the same block (``out = net(X_train[i:j])`` then ``crit(out, y_val[i:j])``)."""
    out = []
    blocks = _blocks(tree)
    loops = [n for n in walk(tree) if isinstance(n, (ast.For, ast.While)) and backward_lines(n)]
    spans = [(loop.lineno, loop.end_lineno or loop.lineno) for loop in loops]
    for node in walk(tree):
        if isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Load):
            parts = list(node.elts)
        elif isinstance(node, ast.Call) and _callee(node) not in ("TensorDataset",) and not (
                _callee(node).lower().endswith(("dataset", "set"))):
            parts = list(node.args) + [k.value for k in node.keywords if k.arg is not None]
        else:
            continue
        if not (isinstance(node, ast.Call) and _callee(node) == "zip") and \
                not any(a <= node.lineno <= b for a, b in spans):
            continue
        if isinstance(node, ast.Call) and id(node) in blocks:
            block, at = blocks[id(node)]
            parts = [_model_output(part.id, block, at) or part
                     if isinstance(part, ast.Name) and role_and_split(part) is None else part
                     for part in parts]
        tagged = [(part, _role_through_call(part)) for part in parts]
        inputs = [(part, t[1]) for part, t in tagged if t is not None and t[0] == "inputs"]
        labels = [(part, t[1]) for part, t in tagged if t is not None and t[0] == "labels"]
        if len(inputs) != 1 or len(labels) != 1 or inputs[0][1] == labels[0][1]:
            continue
        (x, xs), (y, ys) = inputs[0], labels[0]
        out.append((node.lineno, ast.unparse(node), ast.unparse(x), xs, ast.unparse(y), ys))
    return sorted(set(out))


def _respelled(text: str, old: str, new: str) -> str | None:
    """``text`` with the words of split ``old`` written as ``new`` (``labels[list(val_idx)]`` ->
    ``labels[list(train_idx)]``), each word in the spelling the script uses for ``new`` when one
    is known; None when nothing changed."""
    spelled = {"train": "train", "val": "val", "test": "test"}

    def swap(match: re.Match) -> str:
        word = match.group(0)
        return spelled[new] if _SPLITS.get(word.lower()) == old else word

    changed = re.sub(r"(?<![A-Za-z])(train|training|tr|trn|val|valid|validation|dev|va|test|"
                     r"testing|tst|te)(?![a-z])", swap, text, flags=re.IGNORECASE)
    return changed if changed != text else None


class SplitPairsCrossed(Rule):
    """
    ## What it does
    Finds a dataset built from the inputs of one split and the labels of another:
    `DigitDataset(images[train_idx], labels[val_idx])`, `TensorDataset(X_val, y_test)`, a
    `Dataset(train_features, test_targets)` — a copy-paste slip after a train/val/test split —
    and the same pairs made by a training loop itself (a loop whose body calls `backward()`):
    `xb, yb = X_train[i:i + bs], y_val[i:i + bs]`, `criterion(model(x_tr), y_te)`, a loss
    given a name the same block assigned the model's output to (`out = net(X_train[i:j])`,
    then `crit(out, y_val[i:j])`, through the name's own methods: `out = out.squeeze(-1)`), and
    `zip(X_train, y_test)` anywhere.
    Whatever the names, a function (or the module's own statements) that reads one table only
    at one part of a split of indices (`train_idx, val_idx = order[:n], order[n:]`) and another
    table only at another part (`features[train_idx]` beside `targets[val_idx]`) is reported
    at the read of the later part.
    Read from the script's source once a backward ran: each call of a callee named
    `...Dataset` or `...Set` (or a class of the script subclassing a Dataset) with exactly one argument named as inputs (`x`, `X`, `images`, `features`,
    `inputs`, `tokens`...) and one named as labels (`y`, `labels`, `targets`...), each tagged
    with a split by its name (`X_train`, `train_labels`) or by the index it is taken with
    (`labels[list(val_idx)]`), the two splits differing.

    ## Why is this bad?
    The dataset pairs each input with the label of another sample (of another split, in
    another order). Nothing fails when the two splits have the same length (val and test), or
    when a custom Dataset takes its length from one of them: the model trains on labels that
    carry no information about its inputs, the loss stays near chance, and the validation of
    the other split looks as bad for no visible reason.

    ## Example
    ```python
    train_idx, val_idx = random_split(range(len(images)), [1000, 200])
    train_set = DigitDataset(images[list(train_idx)], labels[list(val_idx)])
    ```

    ## Use instead
    ```python
    train_set = DigitDataset(images[list(train_idx)], labels[list(train_idx)])
    ```

    ## Stays silent on
    Inputs and labels of one split, however spelled (`X_tr, y_tr`, `images[idx_train]`,
    `train_ds.x, train_ds.y`); a call with two inputs or two labels (a pair of views, a
    teacher's targets); arguments without a split in their name or index (`X[idx], y[idx]`); a
    name and an index that disagree (`X_train[val_idx]`: a sub-split of the training data);
    calls of anything but a dataset (plots, metrics) outside the training loops, but `zip`; an
    evaluation in the training loop that reads one held-out pair (`model(X_val)`, `y_val`); a
    call given both pairs (`fit(X_train, y_train, X_val, y_val)`); a name holding a model output
    that was bound in another block (before the batch loop, under an `if`), which the loss may
    not read.
    """

    code = "GD333"
    slug = "split-pairs-crossed"
    severity = Severity.WARNING
    summary = ("a dataset pairs the inputs of one data split with the labels of another: every "
               "sample is trained towards another sample's label")
    fix = "take the labels from the same split as the inputs"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            built = crossed_pairs(tree)
            lines = {found[0] for found in built}
            made = [found for found in crossed_in_training(tree) if found[0] not in lines]
            for line, call, x, xs, y, ys in [*built, *made]:
                same = _respelled(y, ys, xs)
                what = "the dataset built here pairs" if line in lines else "this line pairs"
                yield self.finding(
                    f"{what} `{x}` (the {xs} split's inputs) with `{y}` "
                    f"(the {ys} split's labels): each {xs} sample gets the label of another "
                    f"sample, and the model trains towards labels that say nothing about its "
                    f"inputs",
                    Location(path, line),
                    fix=(f"take the labels of the {xs} split: `{same}`" if same else
                         f"take the labels of the {xs} split, as the inputs"),
                    evidence={"inputs": x, "inputs_split": xs, "labels": y, "labels_split": ys})
            lines |= {found[0] for found in made}
            for line, table, part, inputs, first in split_parts_crossed(tree):
                if line in lines:
                    continue
                yield self.finding(
                    f"this reads `{table}` at `{part}` while the same code reads `{inputs}` only "
                    f"at `{first}`, another part of the same split: row i of `{inputs}"
                    f"[{first}]` is paired with row i of `{table}[{part}]`, another sample, so "
                    f"the model trains towards labels that say nothing about its inputs",
                    Location(path, line),
                    fix=f"read `{table}` at the inputs' part: `{table}[{first}]`",
                    evidence={"inputs": inputs, "inputs_split": first, "labels": table,
                              "labels_split": part})
