from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk


def _const_int(node: ast.AST | None) -> int | None | bool:
    """The int a slice bound spells (``None`` when absent); False when not a plain literal."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        return node.value
    return False


def _has_literal_index(index: ast.AST) -> bool:
    """Whether a subscript picks a fixed part: a literal index or a slice with a literal bound
    somewhere in it (``out[:, 0:1]``, ``out[..., 1]``, ``pair[0]``)."""
    for part in (index.elts if isinstance(index, ast.Tuple) else [index]):
        if isinstance(part, ast.Constant) and type(part.value) is int:
            return True
        if isinstance(part, ast.Slice) and any(
                isinstance(b, ast.Constant) and type(b.value) is int for b in (part.lower, part.upper)):
            return True
    return False


def _rows(sub: ast.Subscript) -> tuple[int, int | None] | None:
    """``(start, stop)`` of a plain row slice with literal bounds (``x[2000:2500]``, ``x[:800]``,
    ``x[800:]``); None for anything else."""
    index = sub.slice
    if not isinstance(index, ast.Slice) or index.step is not None:
        return None
    lo, hi = _const_int(index.lower), _const_int(index.upper)
    if lo is False or hi is False:
        return None
    return (lo or 0, hi)


def _disjoint(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    (a0, a1), (b0, b1) = a, b
    return (a1 is not None and a1 <= b0) or (b1 is not None and b1 <= a0)


def _overlaps(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    return not _disjoint(a, b)


def _later_stores(block: list[ast.stmt], after: int, names: set[str]) -> bool:
    for stmt in block[after + 1:]:
        for n in walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in names:
                return True
    return False


def _blocks(tree: ast.AST):
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _pairs(stmt: ast.stmt):
    """``[(target name, value)]`` of a tuple unpacking of as many values (``a, b = u, v``)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Tuple) and isinstance(stmt.value, ast.Tuple)):
        return None
    names, values = stmt.targets[0].elts, stmt.value.elts
    if len(names) != len(values) or not all(isinstance(n, ast.Name) for n in names):
        return None
    if len({n.id for n in names}) != len(names):
        return None
    return [(n.id, v) for n, v in zip(names, values)]


def mismatched_unpackings(tree: ast.AST) -> list[dict]:
    """Each tuple unpacking whose parallel subscripts disagree with what the unpacking pairs:

    - ``duplicate``: two names given the same fixed part of one tensor (``mu, log_var =
      out[:, 0:1], out[:, 0:1]``), neither name rebound later in its block;
    - ``rows``: two arrays sliced at disjoint literal row ranges (``x_cal, y_cal = x[2000:2500],
      labels[2500:3000]``) where another unpacking of the file pairs the same two arrays at one
      and the same range (the arrays are row-aligned)."""
    unpackings = []
    for block in _blocks(tree):
        for i, stmt in enumerate(block):
            pairs = _pairs(stmt)
            if pairs:
                unpackings.append((block, i, stmt, pairs))
    aligned: dict[tuple[str, str], list[tuple[int, tuple]]] = {}
    for _, _, stmt, pairs in unpackings:
        subs = [(v.value.id, _rows(v)) for _, v in pairs
                if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name)]
        for i, (a, ra) in enumerate(subs):
            for b, rb in subs[i + 1:]:
                if a != b and ra is not None and ra == rb:
                    aligned.setdefault((a, b), []).append((stmt.lineno, ra))
                    aligned.setdefault((b, a), []).append((stmt.lineno, ra))
    found = _permuted_alone(tree, unpackings)
    for block, i, stmt, pairs in unpackings:
        done = False
        for j, (name_a, va) in enumerate(pairs):
            for name_b, vb in pairs[j + 1:]:
                if done or not (isinstance(va, ast.Subscript) and isinstance(vb, ast.Subscript)):
                    continue
                if not (isinstance(va.value, ast.Name) and isinstance(vb.value, ast.Name)):
                    continue
                if (va.value.id == vb.value.id and ast.dump(va) == ast.dump(vb)
                        and _has_literal_index(va.slice)
                        and not _later_stores(block, i, {name_a, name_b})):
                    found.append({"line": stmt.lineno, "kind": "duplicate", "names": (name_a, name_b),
                                  "text": ast.unparse(va)})
                    done = True
                    continue
                ra, rb = _rows(va), _rows(vb)
                if va.value.id == vb.value.id or ra is None or rb is None or not _disjoint(ra, rb):
                    continue
                siblings = [(line, r) for line, r in aligned.get((va.value.id, vb.value.id), ())
                            if line != stmt.lineno]
                if not siblings:
                    continue
                # the slice that lands on rows another split of the pair uses is the one to change
                a_clash = any(_overlaps(ra, r) for _, r in siblings)
                b_clash = any(_overlaps(rb, r) for _, r in siblings)
                good, bad = (vb, va) if a_clash and not b_clash else (va, vb)
                fixed = ast.Subscript(bad.value, good.slice, ast.Load())
                found.append({"line": stmt.lineno, "kind": "rows", "names": (name_a, name_b),
                              "text": ast.unparse(bad), "other": ast.unparse(good),
                              "fixed": ast.unparse(fixed), "sibling": siblings[0][0]})
                done = True
    return found


_DRAWS = frozenset({"randperm", "permutation", "argsort", "randint", "multinomial", "choice"})


def _drawn_orders(tree: ast.AST) -> set[str]:
    """Names assigned a random order or draw of indices (``perm = torch.randperm(n)``,
    ``idx = np.random.permutation(n)``)."""
    out = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _DRAWS:
                out.add(node.targets[0].id)
    return out


def _paired(tree: ast.AST) -> set[frozenset]:
    """Pairs of names one unpacking of a call or a loop produces together (``x, y =
    sample_tasks(b, n)``, ``for x, y in loader``): arrays that belong together."""
    out = set()
    for node in walk(tree):
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.For):
            target, value = node.target, node.iter
        if isinstance(target, ast.Tuple) and not isinstance(value, ast.Tuple):
            names = [n.id for n in target.elts if isinstance(n, ast.Name)]
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    out.add(frozenset((a, b)))
    return out


def _permuted_alone(tree: ast.AST, unpackings: list) -> list[dict]:
    """``permuted``: one array of a pair reordered by a drawn order and its partner given as it
    is, in one unpacking (``x_ctx, y_ctx = x[:, perm], y``), the partner not reordered later in
    the block."""
    orders, pairs_made = _drawn_orders(tree), _paired(tree)
    if not orders or not pairs_made:
        return []
    found = []
    for block, i, stmt, pairs in unpackings:
        for j, (name_a, va) in enumerate(pairs):
            for name_b, vb in pairs[j + 1:]:
                for (na, sub), (nb, bare) in (((name_a, va), (name_b, vb)),
                                              ((name_b, vb), (name_a, va))):
                    if not (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name)
                            and isinstance(bare, ast.Name)):
                        continue
                    drawn = {n.id for n in walk(sub.slice) if isinstance(n, ast.Name)} & orders
                    if not drawn or frozenset((sub.value.id, bare.id)) not in pairs_made:
                        continue
                    if _later_stores(block, i, {nb}):
                        continue
                    fixed = ast.Subscript(ast.Name(bare.id, ast.Load()), sub.slice, ast.Load())
                    found.append({"line": stmt.lineno, "kind": "permuted", "names": (na, nb),
                                  "text": ast.unparse(sub), "bare": bare.id,
                                  "order": sorted(drawn)[0], "fixed": ast.unparse(fixed)})
    return found


_SIBLING_TAIL = 2  # characters at most that tell two sibling names apart (r / r2, pred_a / pred_b)


def _siblings(a: str, b: str) -> bool:
    """Whether two names are numbered or lettered siblings: equal but for a short tail of
    digits, or of one letter after an underscore (``r``/``r2``, ``yr1``/``yr2``, ``out_a``/
    ``out_b``)."""
    if a == b or not a.isidentifier() or not b.isidentifier():
        return False
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    stem, ta, tb = a[:common], a[common:], b[common:]
    if not stem.rstrip("_0123456789") or max(len(ta), len(tb)) > _SIBLING_TAIL:
        return False
    if all(t.isdigit() or t == "" for t in (ta, tb)):
        return True
    return stem.endswith("_") and all(len(t) == 1 and t.isalpha() for t in (ta, tb))


def _sources(tree: ast.AST) -> dict[str, set[str]]:
    """For each name, the names it is a row pick or copy of through one assignment (``v =
    valid[idx]``, ``x, v = X[idx], valid[idx]``)."""
    found: dict[str, set[str]] = {}

    def note(target, value):
        base = value
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(target, ast.Name) and isinstance(base, ast.Name) and base.id != target.id:
            found.setdefault(target.id, set()).add(base.id)

    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                    and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts):
                    note(t, v)
            else:
                note(target, value)
    return found


def _argument_parts(tree: ast.AST) -> dict[str, set[str]]:
    """For each name, the texts of the literal-indexed subscripts the file hands to a call as an
    argument (``masked_l1(p1, yb[:, 0], ob[:, 0])``): parts that play an argument's role."""
    parts: dict[str, set[str]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) \
                        and _has_literal_index(arg.slice):
                    parts.setdefault(arg.value.id, set()).add(ast.unparse(arg.slice))
    return parts


def _calls_in(stmt: ast.stmt) -> list[ast.Call]:
    return [n for n in walk(stmt) if isinstance(n, ast.Call)]


_PARALLEL_SPAN = 4  # statements apart, at most, for two calls of one helper to be a copied pair


def copied_calls(tree: ast.AST) -> list[dict]:
    """Two calls of one function a few statements apart in one block whose other arguments are
    sibling names or other fixed parts of one tensor (``masked_mse(r, yr, v[:, 0:1])``,
    ``masked_mse(r2, yr2, v[:, 0:1])``; ``f(p2, y[:, 1], m[:, 1])``, ``f(p3, y[:, 2], m[:, 1])``) while
    one argument is the very same fixed part of one tensor, which the file (or the tensor it is
    a row pick of) also hands to a call at another fixed part: the copy's index was not edited.
    A tensor whose other parts are only read some other way (``meta[:, 1] > 0.5``, a domain id
    beside a shared sample weight ``meta[:, 0]``) is shared on purpose. The later call is
    reported."""
    sources, parts = _sources(tree), _argument_parts(tree)
    found = []
    for block in _blocks(tree):
        calls = [(i, stmt, c) for i, stmt in enumerate(block) if not isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef))
                 for c in _calls_in(stmt)]
        for x, (i, _, first) in enumerate(calls):
            for j, stmt, second in calls[x + 1:]:
                if j == i or j - i > _PARALLEL_SPAN or first.keywords or second.keywords:
                    continue
                if ast.dump(first.func) != ast.dump(second.func) or len(first.args) != len(second.args):
                    continue
                same, sibling = None, False
                for a, b in zip(first.args, second.args):
                    if isinstance(a, ast.Name) and isinstance(b, ast.Name):
                        if a.id == b.id:
                            continue
                        if not _siblings(a.id, b.id):
                            break
                        sibling = True
                    elif ast.dump(a) == ast.dump(b):
                        if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) \
                                and _has_literal_index(a.slice):
                            same = a
                    elif isinstance(a, ast.Subscript) and isinstance(b, ast.Subscript) \
                            and isinstance(a.value, ast.Name) and isinstance(b.value, ast.Name) \
                            and a.value.id == b.value.id and _has_literal_index(a.slice) \
                            and _has_literal_index(b.slice):
                        sibling = True  # the copy's other index was edited
                    else:
                        break
                else:
                    if same is None or not sibling:
                        continue
                    name = same.value.id
                    others = set().union(parts.get(name, set()),
                                         *(parts.get(s, set()) for s in sources.get(name, ())))
                    if len(others - {ast.unparse(same.slice)}) == 0:
                        continue
                    found.append({"line": stmt.lineno, "kind": "calls", "first": first.lineno,
                                  "text": ast.unparse(same), "call": ast.unparse(second.func)})
    return found


class UnpackedSlicesMismatched(Rule):
    """
    ## What it does
    Reads the tuple unpackings of the script's source (`a, b = u, v`), in the files a backward
    ran from, and finds two kinds of parallel subscripts that disagree with what the unpacking
    pairs: two names given the very same fixed part of one tensor (`mu, log_var = out[:, 0:1],
    out[:, 0:1]`: the second column never read), and two row-aligned arrays sliced at
    disjoint row ranges (`x_cal, y_cal = x[2000:2500], labels[2500:3000]`) where another
    unpacking of the file pairs the same two arrays at one range (`x[:2000], labels[:2000]`).
    It also finds one of a pair of arrays (two names one call or loop unpacks together, `x, y =
    sample_tasks(...)`) reordered by a drawn order while its partner is given as it is, in
    one unpacking (`x_ctx, y_ctx = x[:, perm], y`: a neural process's context points with
    another point's values). It points at the unpacking. It also finds the copied call: two calls of one function a few
    statements apart whose other arguments are sibling names (`r`/`r2`, `out_a`/`out_b`) or
    other fixed parts of one tensor (`y[:, 1]`/`y[:, 2]`) while
    one argument is the very same fixed part of one tensor (`masked_mse(r, y, v[:, 0:1])` then
    `masked_mse(r2, y2, v[:, 0:1])`), a tensor the file (or the one it is a row pick of) also
    takes at another fixed part; it points at the later call.

    ## Why is this bad?
    A copied slice whose index was not edited gives two quantities one value: a mean and its
    log-variance read from one output column, so the variance head is the mean and the
    Gaussian likelihood trains neither; one column of the network never reaches the loss.
    A second task's loss masked with the first task's validity column trains on the rows the
    first task has labels for (missing labels counted as targets) and skips its own.
    A context set whose inputs are shuffled and whose values are not pairs each input with
    another point's value: the model learns from noise. Rows of inputs paired with another split's labels teach (or calibrate, or score) the model
    on labels that belong to other samples. Nothing fails: the shapes agree, and the loss
    still moves.

    ## Example
    ```python
    out = net(x)
    mu, log_var = out[:, 0:1], out[:, 0:1]
    x_train, y_train = x[:2000], labels[:2000]
    x_cal, y_cal = x[2000:2500], labels[2500:3000]
    ```

    ## Use instead
    ```python
    out = net(x)
    mu, log_var = out[:, 0:1], out[:, 1:2]
    x_train, y_train = x[:2000], labels[:2000]
    x_cal, y_cal = x[2000:2500], labels[2000:2500]
    ```

    ## Stays silent on
    Different parts of one tensor (`out[:, 0], out[:, 1]`, `seq[:-1], seq[1:]`); the same
    index of two tensors (`x[idx], y[idx]`); two names given one part when either is rebound
    afterwards in its block (a copy kept before an edit); a lag between two series
    (`x[:-1], y[1:]`: overlapping rows, not literal ranges); arrays never paired at one range
    elsewhere in the file; an unpacking of a call (`mu, log_var = out.chunk(2, 1)`); two calls
    that share a part on purpose (twin critics' `F.mse_loss(q1, y[:, 0])`, `F.mse_loss(q2,
    y[:, 0])` where the file hands no other part of `y` to a call; two heads weighed by one
    sample-weight column `meta[:, 0]` while `meta[:, 1]` is only compared, a domain id), calls
    whose other arguments are not siblings, calls with keywords.
    """

    code = "GD369"
    slug = "unpacked-slices-mismatched"
    severity = Severity.WARNING
    summary = ("one unpacking gives two names the same slice of one tensor, or slices two "
               "row-aligned arrays at different rows, or a copied call keeps the first call's slice")
    fix = "give each name its own part (out[:, 0:1], out[:, 1:2]); slice paired arrays at the same rows"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in copied_calls(tree):
                yield self.finding(
                    f"this call of `{hit['call']}` repeats the call at line {hit['first']} with "
                    f"its other arguments moved to their siblings, but passes the same "
                    f"`{hit['text']}` again, though the file takes other parts of that tensor "
                    f"elsewhere: a copied line whose index was not edited, so this term reads "
                    f"the first one's part (another task's mask or column) and its own part "
                    f"never reaches the computation",
                    Location(path, hit["line"]),
                    related=(Related(Location(path, hit["first"]), "the call it was copied from"),),
                    evidence={"kind": "calls", "slice": hit["text"], "first_line": hit["first"]},
                    fix=f"give this call its own part of the tensor instead of `{hit['text']}` "
                        f"(the column or index of its own task)")
            for hit in mismatched_unpackings(tree):
                first, second = hit["names"]
                if hit["kind"] == "duplicate":
                    yield self.finding(
                        f"`{first}` and `{second}` are both given `{hit['text']}`: one unpacking "
                        f"reads the same part of the tensor twice, so `{second}` is `{first}` and "
                        f"whatever part of the tensor `{second}` was meant to read never reaches "
                        f"the computation (a copied slice whose index was not changed)",
                        Location(path, hit["line"]),
                        evidence={"kind": "duplicate", "names": [first, second], "slice": hit["text"]},
                        fix=f"give `{second}` its own part of the tensor, not `{hit['text']}` again")
                elif hit["kind"] == "permuted":
                    yield self.finding(
                        f"`{first}` and `{second}` are unpacked from `{hit['text']}` and "
                        f"`{hit['bare']}`: the pair is reordered by `{hit['order']}` on one side "
                        f"only, so each element of `{first}` is matched with another element's "
                        f"partner in `{second}`",
                        Location(path, hit["line"]),
                        evidence={"kind": "permuted", "names": [first, second],
                                  "slices": [hit["text"], hit["bare"]]},
                        fix=f"reorder both with the same index: `{hit['fixed']}`")
                else:
                    yield self.finding(
                        f"`{first}` and `{second}` are unpacked from row ranges that do not overlap "
                        f"(`{hit['other']}` and `{hit['text']}`), though the same two arrays are "
                        f"paired at one range elsewhere: each row of one is matched with another "
                        f"sample's row of the other",
                        Location(path, hit["line"]),
                        related=(Related(Location(path, hit["sibling"]),
                                         "the same arrays paired at one range here"),),
                        evidence={"kind": "rows", "names": [first, second],
                                  "slices": [hit["other"], hit["text"]]},
                        fix=f"slice both at the same rows: `{hit['fixed']}`")
