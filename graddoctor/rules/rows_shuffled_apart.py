from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from ..analysis.source import scope_walk as _scope_walk
from .base import Rule
from ..analysis.source import walk

_DRAWS = frozenset({"randperm", "permutation", "shuffle"})


def _draw_call(tree: ast.AST, line: int) -> ast.Call | None:
    for node in walk(tree):
        if isinstance(node, ast.Call) and getattr(node, "lineno", None) == line:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _DRAWS:
                return node
    return None


def _scope(tree: ast.AST, line: int) -> ast.AST:
    """The innermost function holding ``line``, else the module."""
    best = tree
    for node in walk(tree):
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
    parents = {child: parent for parent in walk(tree) for child in ast.iter_child_nodes(parent)}
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
    return {ast.unparse(node.value) for node in walk(_scope(tree, line))
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


def _cut_orders(scope: ast.AST) -> tuple[set[str], dict[str, tuple[str, str]]]:
    """The names holding a drawn permutation in one function (or the module), and each name
    holding a part of one (``idx = perm[i:i + bs]``) -> (the permutation's name, the slice's
    text ``i:i + bs``)."""
    orders = set()
    for node in _scope_walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call):
            func = node.value.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in ("randperm", "permutation"):
                orders.add(node.targets[0].id)
    cuts = {}
    for node in _scope_walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.Name) \
                and node.value.value.id in orders and isinstance(node.value.slice, ast.Slice):
            cuts[node.targets[0].id] = (node.value.value.id, ast.unparse(node.value.slice))
    return orders, cuts


def _put_in_order(scope: ast.AST, orders: set[str]) -> set[str]:
    """The names assigned a whole array put in a drawn order (``X_sh = X[perm]``, also in a
    tuple): their raw slices are already in that order."""
    names = set()
    for node in _scope_walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                else [(target, value)]
            for t, v in pairs:
                if isinstance(t, ast.Name) and isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Name) \
                        and v.slice.id in orders:
                    names.add(t.id)
    return names


def cut_apart(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``[(line of the plain read, the array taken in the drawn order, its index, the array taken
    in the original order, the slice)]`` where one block of statements reads one array's rows
    through a part of a permutation (``X[idx]``, ``idx = perm[i:i + bs]``, or
    ``X[perm[i:i + bs]]``) and another array's rows at the same positions of the original
    order (``Y[i:i + bs]``)."""
    found = []
    scopes = [tree, *(n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        orders, cuts = _cut_orders(scope)
        ordered = _put_in_order(scope, orders)
        blocks = [n.body for n in [scope, *_scope_walk(scope)]
                  if isinstance(getattr(n, "body", None), list)]
        for block in blocks:
            simple = [stmt for stmt in block if isinstance(stmt, (ast.Assign, ast.Expr, ast.Return))]
            reads = [(stmt.lineno, n) for stmt in simple for n in walk(stmt)
                     if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                     and isinstance(n.ctx, ast.Load)]
            shuffled, plain = [], []
            for line, r in reads:
                index = r.slice
                if isinstance(index, ast.Name) and index.id in cuts:
                    shuffled.append((r.value.id, index.id, cuts[index.id][1]))
                elif isinstance(index, ast.Subscript) and isinstance(index.value, ast.Name) \
                        and index.value.id in orders and isinstance(index.slice, ast.Slice):
                    shuffled.append((r.value.id, ast.unparse(index), ast.unparse(index.slice)))
                elif isinstance(index, ast.Slice) and r.value.id not in orders | ordered:
                    plain.append((line, r.value.id, ast.unparse(index)))
            for array, index, cut in shuffled:
                for line, other, piece in plain:
                    if other != array and piece == cut:
                        found.append((line, array, index, other, piece))
    return sorted(set(found))


def _is_draw(node: ast.AST | None) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in _DRAWS


def _paired_call(node: ast.Call) -> bool:
    """A call that pairs its arguments row by row: a dataset's construction (``TensorDataset``,
    a class named ``...Dataset``) or ``zip``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "zip" or name.endswith("Dataset")


def fields_permuted_apart(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``[(line, the call, the argument taken in a random order, an argument left in its
    order)]`` for each dataset construction (or ``zip``) pairing arrays row by row where one
    argument is indexed by a random permutation (inline, or a name the scope binds once to
    one) and another is passed in its own order."""
    found = []
    scopes = [tree, *(n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        bound: dict[str, list] = {}
        for node in _scope_walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in walk(target):
                        if isinstance(name, ast.Name):
                            bound.setdefault(name.id, []).append(node.value if target is name else None)
        for node in _scope_walk(scope):
            if not (isinstance(node, ast.Call) and _paired_call(node) and len(node.args) >= 2):
                continue
            orders, plain = {}, []
            for arg in node.args:
                if isinstance(arg, ast.Subscript):
                    index = arg.slice
                    drawn = _is_draw(index) or isinstance(index, ast.Name) \
                        and len(bound.get(index.id, [])) == 1 and _is_draw(bound[index.id][0])
                    if drawn:
                        orders[ast.unparse(arg)] = ast.unparse(index)
                        continue
                if isinstance(arg, (ast.Name, ast.Attribute)):
                    plain.append(ast.unparse(arg))
            if len(set(orders.values())) == 1 and plain:
                shuffled = next(iter(orders))
                found.append((node.lineno, ast.unparse(node), shuffled, plain[0]))
    return sorted(set(found))


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
    One permutation indexing inputs and labels (also sliced per batch, `x[perm[i:i + bs]]`,
    or both arrays put in the order first and then sliced alike);
    two shuffles reseeded alike before each (`np.random.seed(s)` then each shuffle: both in
    one order); two sets of inputs each in an order of its own (unpaired domains, CycleGAN's A
    and B), or one order applied to a whole dataset (inputs and labels) and another to a second
    dataset; a mixup or CutMix `randperm` of the batch that reorders inputs and labels
    together; orders of different lengths (a batch's and the dataset's), or drawn in
    libraries' code (a DataLoader's sampler); an order drawn once and a second one drawn after
    a backward (not the same pairing). A dataset's construction (`TensorDataset(x, y[perm])`,
    `zip`) given one field indexed by a random permutation and another in its own order is
    reported too, at the construction. Not told apart: a `numpy.random.Generator`'s
    `permutation` (its methods cannot be watched), orders drawn in a helper that returns them.
    """

    code = "GD316"
    slug = "rows-shuffled-apart"
    severity = Severity.WARNING
    summary = ("inputs and labels are put in two different random orders: every row meets "
               "another sample's label")
    fix = "draw one random order and index (or shuffle) inputs and labels with it together"

    def check(self, a):
        yield from self._cut_apart(a)
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

    def _cut_apart(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, array, index, other, piece in cut_apart(tree):
                yield self.finding(
                    f"`{array}[{index}]` takes its rows in a random order while `{other}[{piece}]` "
                    f"takes the rows at the same positions of the original order: row i of one no "
                    f"longer belongs to the sample of row i of the other, so every batch pairs "
                    f"inputs with other samples' targets",
                    Location(path, line),
                    evidence={"kind": "one order", "shuffled": array, "index": index,
                              "unshuffled": other, "slice": piece},
                    fix=f"index both with the same rows: `{other}[{index}]`")
            for line, call, shuffled, other in fields_permuted_apart(tree):
                yield self.finding(
                    f"`{call}` pairs `{shuffled}`, taken in a random order, with `{other}` in its "
                    f"own order: row i of one no longer belongs to the sample of row i of the other, "
                    f"so every pair the dataset serves is an input with another sample's target",
                    Location(path, line),
                    evidence={"kind": "fields", "shuffled": shuffled, "unshuffled": other, "call": call},
                    fix="index every field with the same permutation, or none of them")
