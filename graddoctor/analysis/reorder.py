"""Batch fields put in another order apart from each other, read from the script's source
(inputs-permuted-without-labels, for batches no DataLoader serves).

A training loop that sorts a batch by length for ``pack_padded_sequence``, or shuffles it, must
reorder every field of the batch with the same indices. The walk below looks, in each loop that
calls ``backward``, for names unpacked together from one value (``feats, lengths, y = batch``,
``for x, y in pairs``), a permutation made there (``lengths, order = lengths.sort(...)``,
``order = lengths.argsort()``, ``perm = torch.randperm(n)``), fields rebound in its order
(``feats = feats[order]``, ``x = x.index_select(0, perm)``) and another field of the same
unpacking that keeps the old order while a loss call reads it (directly or through the names
assigned from it). A permutation the loop uses in any other way (an inverse for putting the
outputs back, ``order.argsort()``, a write ``out[order] = ...``) or a field copied under a new
name (negatives, a mixup partner) is not this pattern and is left alone."""

from __future__ import annotations

import ast
import re

from .source import scope_walk
from .source import walk

_PERMUTING = ("argsort", "randperm", "permutation")
# a loss function's or criterion's name (``F.l1_loss``, ``criterion``, ``bce``), not a layer's
# that happens to hold the letters (``max_pool1d``)
_LOSS_NAME = re.compile(r"loss|crit|cross_entropy|(^|_)(nll|mse|l1|bce|kl_div|ctc|huber)(_|$)")


def _last(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def _permutation(stmt: ast.stmt) -> tuple[str, str | None] | None:
    """``(permutation's name, the field it sorts or None)`` when ``stmt`` makes one."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) \
            and value.slice.value == 1:
        value = value.value  # t.sort()[1]
    elif isinstance(value, ast.Attribute) and value.attr == "indices":
        value = value.value
    if not isinstance(value, ast.Call):
        return None
    name = _last(value.func)
    source = None
    if isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Name) \
            and value.func.value.id not in ("torch", "np", "numpy"):
        source = value.func.value.id
    elif value.args and isinstance(value.args[0], ast.Name):
        source = value.args[0].id
    if name == "sort":
        if isinstance(target, ast.Tuple) and len(target.elts) == 2 \
                and isinstance(target.elts[1], ast.Name):
            return target.elts[1].id, source
        if isinstance(target, ast.Name) and stmt.value is not value:
            return target.id, source
        return None
    if name in _PERMUTING and isinstance(target, ast.Name):
        return target.id, source if name == "argsort" else None
    return None


def _inline_reordering(stmt: ast.stmt) -> tuple[str, int] | None:
    """``(name, line)`` when ``stmt`` rebinds a name to its rows in a random order drawn inline
    (``x = x[torch.randperm(len(x))]``)."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 \
            or not isinstance(stmt.targets[0], ast.Name):
        return None
    value = stmt.value
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
            and value.value.id == stmt.targets[0].id and isinstance(value.slice, ast.Call) \
            and _last(value.slice.func) in ("randperm", "permutation"):
        return value.value.id, stmt.lineno
    return None


def _reindexed(expr: ast.AST, perm: str) -> str | None:
    """The name ``expr`` reorders by ``perm`` (``x[perm]``, ``x.index_select(0, perm)``,
    ``torch.index_select(x, 0, perm)``), or None."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name) \
            and isinstance(expr.slice, ast.Name) and expr.slice.id == perm:
        return expr.value.id
    if isinstance(expr, ast.Call) and _last(expr.func) == "index_select":
        args = list(expr.args)
        if isinstance(expr.func, ast.Attribute) and isinstance(expr.func.value, ast.Name) \
                and expr.func.value.id not in ("torch",):
            args = [expr.func.value, *args]
        if len(args) == 3 and isinstance(args[0], ast.Name) and isinstance(args[2], ast.Name) \
                and args[2].id == perm:
            return args[0].id
    return None


def _unpacked_groups(loop: ast.AST, statements: list[ast.stmt]) -> list[tuple[int, list[str]]]:
    """``(line, names)`` of each unpacking of two names or more: the loop's own target and the
    tuple assignments of its body."""
    groups = []
    targets = [(loop.lineno, loop.target)] if isinstance(loop, ast.For) else []
    targets += [(s.lineno, s.targets[0]) for s in statements
                if isinstance(s, ast.Assign) and len(s.targets) == 1]
    for line, target in targets:
        if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts) \
                and len(target.elts) >= 2:
            groups.append((line, [e.id for e in target.elts]))
    return groups


def _is_loss_call(call: ast.Call) -> bool:
    return _LOSS_NAME.search((_last(call.func) or "").lower()) is not None


def fields_reordered_apart(tree: ast.AST) -> list[tuple[int, str, list[str], int, str]]:
    """``(line of the first reordering, permutation, fields left in order, line of the loss call
    that reads one, that field)`` for each loop that calls ``backward`` (see the module's docs)."""
    found = []
    loops = [n for n in walk(tree) if isinstance(n, (ast.For, ast.While))]
    for loop in loops:
        nodes = list(scope_walk(loop))
        if not any(isinstance(n, ast.Call) and _last(n.func) == "backward" for n in nodes):
            continue
        if any(isinstance(n, (ast.For, ast.While)) and n is not loop for n in nodes):
            continue  # the innermost loop that trains is the one read
        statements = sorted((n for n in nodes if isinstance(n, ast.stmt)), key=lambda s: s.lineno)
        groups = _unpacked_groups(loop, statements)
        for stmt in statements:
            inline = _inline_reordering(stmt)
            if inline is not None:  # x = x[torch.randperm(len(x))]: an order of its own
                field, line = inline
                for unpacked, names in groups:
                    if field in names and unpacked < line:
                        left = [n for n in names if n != field]
                        hit = _read_by_loss(statements, left, unpacked, line)
                        if hit is not None:
                            found.append((line, "", left, hit[0], hit[1]))
                            break
                continue
            made = _permutation(stmt)
            if made is None:
                continue
            perm, sorted_field = made
            # every use of the permutation must be a reordering of a name rebound to itself
            rebound: dict[str, int] = {}
            other_use = False
            for s in statements:
                if s is stmt:
                    continue
                uses = [n for n in walk(s) if isinstance(n, ast.Name) and n.id == perm]
                if not uses:
                    continue
                if not isinstance(s, ast.Assign) or len(s.targets) != 1:
                    other_use = True
                    break
                target = s.targets[0]
                pairs = list(zip(target.elts, s.value.elts)) \
                    if isinstance(target, ast.Tuple) and isinstance(s.value, ast.Tuple) \
                    and len(target.elts) == len(s.value.elts) else [(target, s.value)]
                reordered = 0
                for t, v in pairs:
                    field = _reindexed(v, perm)
                    if field is not None and isinstance(t, ast.Name) and t.id == field:
                        rebound.setdefault(field, s.lineno)
                        reordered += 1
                    elif perm in _names(v):
                        other_use = True
                if other_use or not reordered:
                    other_use = True
                    break
            if other_use or not rebound:
                continue
            first = min(rebound.values())
            for unpacked, names in groups:
                if not set(rebound) & set(names) or unpacked >= first:
                    continue
                left = [n for n in names if n not in rebound and n != sorted_field
                        and n != perm]
                hit = _read_by_loss(statements, left, unpacked, first)
                if hit is not None:
                    found.append((first, perm, left, hit[0], hit[1]))
                    break
    return sorted(set((a, b, tuple(c), d, e) for a, b, c, d, e in found))


def _read_by_loss(statements: list[ast.stmt], fields: list[str], unpacked: int,
                  after: int) -> tuple[int, str] | None:
    """``(line, field)`` of the first loss call after line ``after`` that reads one of
    ``fields`` (unpacked at line ``unpacked``) as it is or through the names assigned from it."""
    carries = {f: f for f in fields}  # name -> the field whose order it keeps
    for s in statements:
        if s.lineno <= unpacked:
            continue
        if s.lineno > after:
            for call in walk(s):
                if not (isinstance(call, ast.Call) and _is_loss_call(call)):
                    continue
                for arg in [*call.args, *(k.value for k in call.keywords)]:
                    read = sorted(_names(arg) & set(carries))
                    if read:
                        return s.lineno, carries[read[0]]
        if isinstance(s, ast.Assign):
            read = sorted(_names(s.value) & set(carries))
            targets = {n.id for t in s.targets for n in walk(t) if isinstance(n, ast.Name)}
            for name in targets:
                if read:
                    carries[name] = carries[read[0]]
                else:
                    carries.pop(name, None)
    return None


def reordered_beside_kept(tree: ast.AST) -> list[tuple[int, str, list[str], list[str]]]:
    """``(line, permutation, names reordered, names kept)`` for each tuple assignment that
    rebinds some names to their rows in the order of a permutation made in the same scope and
    rebinds another to itself, as it is (``log_h, event = log_h[order], event``): the fields of
    one statement meant to be put in one order, one of them left behind. Any scope, not only a
    training loop: a loss function that sorts its inputs (a Cox risk set, a ranking loss)."""
    found = []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        statements = [n for n in scope_walk(scope) if isinstance(n, ast.stmt)]
        perms = {made[0] for s in statements if (made := _permutation(s)) is not None}
        if not perms:
            continue
        for s in statements:
            if not isinstance(s, ast.Assign) or len(s.targets) != 1:
                continue
            target, value = s.targets[0], s.value
            if not isinstance(target, ast.Tuple) or not isinstance(value, ast.Tuple) \
                    or len(target.elts) != len(value.elts) or len(target.elts) < 2 \
                    or not all(isinstance(t, ast.Name) for t in target.elts):
                continue
            for perm in sorted(perms):
                reordered = [t.id for t, v in zip(target.elts, value.elts) if _reindexed(v, perm) == t.id]
                kept = [t.id for t, v in zip(target.elts, value.elts)
                        if isinstance(v, ast.Name) and v.id == t.id]
                if reordered and kept:
                    found.append((s.lineno, perm, reordered, kept))
                    break
    return sorted(set((a, b, tuple(c), tuple(d)) for a, b, c, d in found))
# -- a collate function that builds its fields from a list of examples in two orders -------------

def _order_of(stmt: ast.stmt) -> tuple[str, str] | None:
    """``(order's name, the examples' list)`` when ``stmt`` assigns the indices of a list in a
    sorted order (``order = sorted(range(len(batch)), key=...)``, ``np.argsort(lengths)`` of
    lengths read from the list is not followed)."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 \
            or not isinstance(stmt.targets[0], ast.Name) or not isinstance(stmt.value, ast.Call):
        return None
    call = stmt.value
    if _last(call.func) != "sorted" or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Call) and _last(first.func) == "range" and len(first.args) == 1 \
            and isinstance(first.args[0], ast.Call) and _last(first.args[0].func) == "len" \
            and first.args[0].args and isinstance(first.args[0].args[0], ast.Name):
        return stmt.targets[0].id, first.args[0].args[0].id
    return None


def _comprehension_order(expr: ast.AST, examples: str, order: str) -> str | None:
    """'order' when the comprehensions of ``expr`` iterate ``order`` and read ``examples[i]``,
    'kept' when they iterate ``examples`` itself, None otherwise (or both)."""
    kinds = set()
    for node in walk(expr):
        if not isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            continue
        for gen in node.generators:
            it = gen.iter
            if isinstance(it, ast.Name) and it.id == order:
                kinds.add("order")
            elif isinstance(it, ast.Name) and it.id == examples:
                kinds.add("kept")
            elif isinstance(it, ast.Call) and _last(it.func) in ("enumerate", "zip") and \
                    any(isinstance(a, ast.Name) and a.id == examples for a in it.args):
                kinds.add("kept")
    return kinds.pop() if len(kinds) == 1 else None


def _built(stmt: ast.stmt, examples: str, order: str) -> tuple[str, str] | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name):
        kind = _comprehension_order(stmt.value, examples, order)
        if kind is not None:
            return stmt.targets[0].id, kind
    return None


def collate_fields_apart(tree: ast.AST) -> list[tuple[int, str, str, str, list[str]]]:
    """``(line, field, examples, order, fields in the order)`` for each function that makes the
    indices of a list of examples in a sorted order (``order = sorted(range(len(batch)),
    key=...)``), builds one field of what it returns from the examples in that order
    (``[batch[i][0] for i in order]``) and another straight from the list (``[y for _, y in
    batch]``): the rows of the two are different samples. A function that returns the order
    (to put the outputs back) or uses it any other way is left alone."""
    found = []
    for func in walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = [s for s in func.body]
        for stmt in body:
            made = _order_of(stmt)
            if made is None:
                continue
            order, examples = made
            fields: dict[str, tuple[str, int]] = {}
            other_use = False
            for s in body:
                if s is stmt:
                    continue
                built = _built(s, examples, order)
                if built is not None:
                    fields[built[0]] = (built[1], s.lineno)
                    continue
                if order in _names(s):
                    other_use = True  # returned, inverted, used to put outputs back
            if other_use:
                continue
            returned = set()
            for s in walk(func):
                if isinstance(s, ast.Return) and s.value is not None:
                    returned |= _names(s.value)
            # names derived in one statement from a field keep its order (lengths of seqs)
            carried = {name: name for name in fields}
            for s in body:
                if isinstance(s, ast.Assign) and len(s.targets) == 1 \
                        and isinstance(s.targets[0], ast.Name) and s.targets[0].id not in fields:
                    read = sorted(_names(s.value) & set(carried))
                    if read:
                        carried[s.targets[0].id] = carried[read[0]]
            reaches = {carried[n] for n in returned if n in carried}
            ordered = sorted(f for f in reaches if fields[f][0] == "order")
            kept = sorted(f for f in reaches if fields[f][0] == "kept")
            if ordered and kept:
                for field in kept:
                    found.append((fields[field][1], field, examples, order, ordered))
    return sorted(set((a, b, c, d, tuple(e)) for a, b, c, d, e in found))


# calls that reorder a tensor's rows (or hand back the indices that do)
_REORDERING = ("sort", "argsort", "randperm", "permutation", "flip", "roll", "index_select",
               "gather", "shuffle")


def _plain_index(index: ast.AST) -> bool:
    """A constant, a slice or a tuple of them (``out[:, -1]``): no index tensor."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(p, (ast.Constant, ast.Slice)) or isinstance(p, ast.UnaryOp)
               and isinstance(p.operand, ast.Constant) for p in parts)


def _reorders(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Subscript) and not _plain_index(n.slice)
               or isinstance(n, ast.Call) and _last(n.func) in _REORDERING
               for n in walk(expr))


def target_reordered_at(tree: ast.AST, loss_line: int | None, model_line: int | None,
                        fn: str) -> int | None:
    """The line of the statement that put a loss's target in another order: the loss call at
    ``loss_line`` (or, with none, the first call of ``fn`` or of a loss-named function within a
    dozen lines after the model's call at ``model_line``) when an argument reorders inline
    (``y[perm]``), else the latest of the arguments' own last assignments before it whose value
    reorders (``target = y[y.argsort()]``); None when no loss call is found."""
    calls = sorted((n for n in walk(tree) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    if loss_line is not None:
        call = next((c for c in calls if c.lineno == loss_line), None)
    elif model_line is not None:
        call = next((c for c in calls if model_line < c.lineno <= model_line + 12
                     and (_last(c.func) == fn or _is_loss_call(c))), None)
    else:
        return None
    if call is None:
        return None
    args = [*call.args, *(k.value for k in call.keywords)]
    if any(_reorders(arg) for arg in args if not isinstance(arg, ast.Name)):
        return call.lineno
    low = (model_line or call.lineno) - 12
    # each argument's own latest assignment: the model's output is often assigned after the
    # statement that reordered the target, so the latest assignment of any argument would hide it
    names = {arg.id for arg in args if isinstance(arg, ast.Name)}
    return _latest_reordering(tree, names, low, call.lineno) or call.lineno


def _latest_reordering(tree: ast.AST, names: set[str], low: int, high: int) -> int | None:
    """The latest line among ``names``' own last assignments in ``[low, high)`` whose value
    reorders rows; None when none of them does."""
    found = []
    for name in names:
        made = [n for n in walk(tree) if isinstance(n, ast.Assign) and low <= n.lineno < high
                and name in {t.id for target in n.targets for t in walk(target) if isinstance(t, ast.Name)}]
        last = max(made, key=lambda n: n.lineno, default=None)
        if last is not None and _reorders(last.value):
            found.append(last.lineno)
    return max(found, default=None)


def input_reordered_at(tree: ast.AST, model_line: int) -> int | None:
    """The line of the statement that put the model's input in another order, for a model's
    call at ``model_line`` whose rows the run found permuted against the loss's target: the
    latest assignment, within a dozen lines before it, of a name a call on that line is given
    whose value reorders (``x = x.flip(0)``, ``x = x[torch.randperm(len(x))]``); None when the
    reordering is inline or not found."""
    names = {arg.id for n in walk(tree) if isinstance(n, ast.Call) and n.lineno == model_line
             for arg in [*n.args, *(k.value for k in n.keywords)] if isinstance(arg, ast.Name)}
    return _latest_reordering(tree, names, model_line - 12, model_line)


def _bodies(tree: ast.AST):
    """The straight statement lists of the module and of each function (their own statements,
    not those of the blocks inside them)."""
    yield getattr(tree, "body", [])
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.body


def _rows_read(expr: ast.AST) -> str | None:
    """The name whose rows ``expr`` is, as it is or sliced (``X``, ``X[:split]``,
    ``X[split:]``, ``torch.as_tensor(X[:n])``), or None."""
    while isinstance(expr, ast.Call) and len(expr.args) == 1 and not expr.keywords \
            and _last(expr.func) in ("as_tensor", "tensor", "from_numpy", "asarray", "array",
                                     "float", "long"):
        expr = expr.args[0]
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and not expr.args \
            and expr.func.attr in ("float", "long", "int", "double", "clone"):
        expr = expr.func.value
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def permuted_before_pairing(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``(line of the reordering, the reordered name, a name unpacked with it and left in its
    order, line of the call that pairs them)``: outside the training loop, two fields unpacked
    together (``X, labels = make_data()``), one rebound to its rows in a random order
    (``X = X[torch.randperm(len(X))]``, or by a permutation used for nothing else) and the
    other not, then both given as rows to one call (``TensorDataset(X[:split],
    labels[:split])``): row i of the inputs is paired with another sample's label."""
    found = []
    for body in _bodies(tree):
        groups: list[tuple[int, list[str]]] = []
        perms: dict[str, int] = {}  # a permutation's name -> where it was made
        moved: dict[str, int] = {}  # a field rebound in a random order -> where
        for stmt in body:
            if isinstance(stmt, (ast.For, ast.While)):
                break  # the training loop: what it does is fields_reordered_apart's
            for call in (n for n in walk(stmt) if isinstance(n, ast.Call)):
                rows = [_rows_read(arg) for arg in call.args]
                hit = next(((r, n) for _, names in groups for r in rows
                            if r in names and r in moved for n in rows
                            if n in names and n != r and n not in moved), None)
                if hit is not None:
                    found.append((moved[hit[0]], hit[0], hit[1], call.lineno))
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target = stmt.targets[0]
            if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                names = [e.id for e in target.elts]
                if isinstance(stmt.value, ast.Tuple) and len(stmt.value.elts) == len(names):
                    # `X, y = X[perm], y[perm]`: each rebound as its own value says
                    for name, value in zip(names, stmt.value.elts):
                        if any(_reindexed(value, p) == name for p in perms):
                            moved[name] = stmt.lineno
                        else:
                            moved.pop(name, None)
                    continue
                if len(names) >= 2:
                    groups.append((stmt.lineno, names))
                for name in names:
                    moved.pop(name, None)
                continue
            inline = _inline_reordering(stmt)
            if inline is not None:
                moved[inline[0]] = inline[1]
                continue
            made = _permutation(stmt)
            if made is not None and made[1] is None:
                perms[made[0]] = stmt.lineno
                continue
            if isinstance(target, ast.Name):
                if any(_reindexed(stmt.value, p) == target.id for p in perms):
                    moved[target.id] = stmt.lineno
                else:
                    moved.pop(target.id, None)
    return sorted(set(found))


def _split_groups(tree: ast.AST) -> list[list[str]]:
    """Names bound together to the parts of one split of indices: ``train_idx, val_idx =
    order[:400], order[400:]`` (slices of one name), or ``train_test_split(idx, ...)``'s."""
    groups = []
    for node in walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Tuple)
                and all(isinstance(e, ast.Name) for e in node.targets[0].elts)
                and len(node.targets[0].elts) >= 2):
            continue
        names = [e.id for e in node.targets[0].elts]
        value = node.value
        if isinstance(value, ast.Tuple) and len(value.elts) == len(names) and all(
                isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Slice)
                and isinstance(v.value, ast.Name) for v in value.elts) \
                and len({v.value.id for v in value.elts}) == 1:
            groups.append(names)
        elif isinstance(value, ast.Call) and _last(value.func) in ("train_test_split", "random_split") \
                and len(value.args) == 1:
            groups.append(names)
    return groups


def split_parts_crossed(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``(line, labels' table, its part, inputs' table, their part)``: a scope (a function, or
    the module's own statements) that reads one table only at one part of a split
    (``features[train_idx]``) and another table only at another part (``targets[val_idx]``):
    the rows of the two no longer belong to the same samples. Reported at the read of the later
    part (a validation or test part used beside training rows)."""
    groups = _split_groups(tree)
    if not groups:
        return []
    found = []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        reads: dict[str, dict[str, int]] = {}  # table -> part -> first line
        for node in scope_walk(scope):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and isinstance(node.slice, ast.Name):
                reads.setdefault(node.value.id, {}).setdefault(node.slice.id, node.lineno)
        for names in groups:
            parts = {t: [p for p in names if p in by] for t, by in reads.items()}
            single = {t: ps[0] for t, ps in parts.items() if len(ps) == 1}
            if any(len(ps) > 1 for ps in parts.values()) or len(set(single.values())) < 2:
                continue  # each table read at every part it is, or at one part only
            first = min(single.values(), key=names.index)
            later = [(reads[t][p], t, p) for t, p in single.items() if p != first]
            inputs = next(t for t, p in single.items() if p == first)
            line, table, part = min(later)
            found.append((line, table, part, inputs, first))
    return sorted(set(found))
