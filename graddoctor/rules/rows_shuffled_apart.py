from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule

_DRAWS = frozenset({"randperm", "permutation", "shuffle"})


def _draw_call(tree: ast.AST, line: int) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node, "lineno", None) == line:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _DRAWS:
                return node
    return None


def _scope(tree: ast.AST, line: int) -> ast.AST:
    """The innermost function holding ``line``, else the module."""
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is tree or node.lineno >= best.lineno:
                best = node
    return best


def _indexes_with(node: ast.AST, name: str) -> bool:
    """Whether a subscript's index is ``name`` or a slice of it (``perm``, ``perm[i:i + bs]``)."""
    if isinstance(node, ast.Name):
        return node.id == name
    if isinstance(node, ast.Subscript):
        return _indexes_with(node.value, name)
    return False


def applied_to(tree: ast.AST, line: int) -> set[str]:
    """What the random order drawn at ``line`` puts in order, as written: the sequence a
    ``shuffle`` is given; the arrays a permutation indexes (``y[np.random.permutation(n)]``, or
    ``perm = ...`` then ``x[perm]``, ``x[perm[i:j]]`` in the same function)."""
    call = _draw_call(tree, line)
    if call is None:
        return set()
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id
    if name == "shuffle":
        return {ast.unparse(call.args[0])} if call.args else set()
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    drawn: ast.AST = call
    parent = parents.get(drawn)
    while isinstance(parent, ast.Subscript) and parent.value is drawn:
        drawn, parent = parent, parents.get(parent)  # a part of the order: ``randperm(n)[:bs]``
    if isinstance(parent, ast.Subscript) and parent.slice is drawn:
        return {ast.unparse(parent.value)}
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name)):
        return set()
    order = parent.targets[0].id
    return {ast.unparse(node.value) for node in ast.walk(_scope(tree, line))
            if isinstance(node, ast.Subscript) and _indexes_with(node.slice, order)}


def _fix(tree: ast.AST, line: int, one: str, other: str) -> str:
    """The fix in the script's own terms: the draw it already makes, applied to both."""
    call = _draw_call(tree, line)
    drawn = ast.unparse(call.func) if call is not None else ""
    if drawn.endswith("shuffle"):
        return (f"shuffle the pairs together: `order = list(range(len({one})))`, "
                f"`{drawn}(order)`, then reorder `{one}` and `{other}` both by `order` "
                f"(or shuffle `list(zip({one}, {other}))`)")
    draw = f"{drawn}(len({one}))" if drawn else f"a permutation of len({one})"
    return f"draw one order and index both with it: `perm = {draw}`, then `{one}[perm]`, `{other}[perm]`"


class RowsShuffledApart(Rule):
    """
    ## What it does
    Finds inputs and labels put in two different random orders: each array indexed by a
    permutation of its own (`x = x[torch.randperm(n)]`, then `y = y[torch.randperm(n)]`), or
    shuffled in place one after the other (`random.shuffle(xs); random.shuffle(ys)`,
    `np.random.shuffle(X); np.random.shuffle(Y)`). Until the first backwards, the random
    orders the script's own code draws (`torch.randperm`, `numpy.random.permutation`,
    `numpy.random.shuffle`, `random.shuffle`) are watched; two of one length drawn from two
    lines with no backward between them that differ, where the source shows one applied to
    an array of inputs (a vector or more a row) and the other to an array of labels (one value
    a row, or whole numbers), are reported at the second.

    ## Why is this bad?
    Row `i` of the inputs and row `i` of the labels no longer belong to the same sample. Every
    batch pairs inputs with other samples' labels; the labels' mix is right, so the loss falls
    to the level of always predicting the commonest class and stays there. Nothing fails.

    ## Example
    ```python
    for epoch in range(epochs):
        x_train = x_train[torch.randperm(len(x_train))]
        y_train = y_train[torch.randperm(len(y_train))]
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        perm = torch.randperm(len(x_train))
        x_train, y_train = x_train[perm], y_train[perm]
    ```

    ## Stays silent on
    One permutation indexing inputs and labels (also sliced per batch, `x[perm[i:i + bs]]`);
    two shuffles reseeded alike before each (`np.random.seed(s)` then each shuffle: both in
    one order); two sets of inputs each in an order of its own (unpaired domains, CycleGAN's A
    and B), or one order applied to a whole dataset (inputs and labels) and another to a second
    dataset; a mixup or CutMix `randperm` of the batch that reorders inputs and labels
    together; orders of different lengths (a batch's and the dataset's), or drawn in
    libraries' code (a DataLoader's sampler); an order drawn once and a second one drawn after
    a backward (not the same pairing). Not told apart: a `numpy.random.Generator`'s
    `permutation` (its methods cannot be watched), orders drawn in a helper that returns them.
    """

    code = "GD316"
    slug = "rows-shuffled-apart"
    severity = Severity.WARNING
    summary = ("inputs and labels are put in two different random orders: every row meets "
               "another sample's label")
    fix = "draw one random order and index (or shuffle) inputs and labels with it together"

    def check(self, a):
        for e in a.of_kind("shuffled_apart"):
            if e.loc is None or not e.get("first"):
                continue
            first_path, first_line = str(e["first"][0]), int(e["first"][1])
            if first_path != e.loc.path:
                continue
            tree = a.source.tree(e.loc.path)
            if tree is None:
                continue
            first, second = applied_to(tree, first_line), applied_to(tree, e.loc.line)
            if len(first) != 1 or len(second) != 1 or first == second:
                continue  # one order applied to several arrays: a dataset shuffled whole
            arrays = e.get("arrays") or {}
            kinds = {arrays.get(next(iter(first))), arrays.get(next(iter(second)))}
            if kinds != {"labels", "rows"}:
                continue  # two sets of inputs (unpaired domains) or arrays not told

            ones, others = ", ".join(f"`{t}`" for t in sorted(first)), \
                ", ".join(f"`{t}`" for t in sorted(second))
            how = ("shuffled in place" if e["kind"] == "shuffle" else "indexed by a permutation")
            yield self.finding(
                f"{others} is {how} of its own here, and {ones} by another at line "
                f"{first_line}: two different random orders of {e['length']} rows. Row i of one "
                f"no longer belongs to the sample of row i of the other, so every batch pairs "
                f"inputs with other samples' labels and the model can learn no more than the "
                f"labels' overall mix",
                e.loc, step=a.next_step_number(e.seq),
                related=(Related(Location(first_path, first_line), "the other random order"),),
                evidence={"kind": e["kind"], "length": e["length"], "first": sorted(first),
                          "second": sorted(second)},
                fix=_fix(tree, first_line, sorted(first)[0], sorted(second)[0]))
