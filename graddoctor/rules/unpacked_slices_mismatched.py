from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule


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
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in names:
                return True
    return False


def _blocks(tree: ast.AST):
    for node in ast.walk(tree):
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
    found = []
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


class UnpackedSlicesMismatched(Rule):
    """
    ## What it does
    Reads the tuple unpackings of the script's source (`a, b = u, v`), in the files a backward
    ran from, and finds two kinds of parallel subscripts that disagree with what the unpacking
    pairs: two names given the very same fixed part of one tensor (`mu, log_var = out[:, 0:1],
    out[:, 0:1]`: the second column never read), and two row-aligned arrays sliced at
    disjoint row ranges (`x_cal, y_cal = x[2000:2500], labels[2500:3000]`) where another
    unpacking of the file pairs the same two arrays at one range (`x[:2000], labels[:2000]`).
    It points at the unpacking.

    ## Why is this bad?
    A copied slice whose index was not edited gives two quantities one value: a mean and its
    log-variance read from one output column, so the variance head is the mean and the
    Gaussian likelihood trains neither; one column of the network never reaches the loss.
    Rows of inputs paired with another split's labels teach (or calibrate, or score) the model
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
    elsewhere in the file; an unpacking of a call (`mu, log_var = out.chunk(2, 1)`).
    """

    code = "GD369"
    slug = "unpacked-slices-mismatched"
    severity = Severity.WARNING
    summary = ("one unpacking gives two names the same slice of one tensor, or slices two "
               "row-aligned arrays at different rows")
    fix = "give each name its own part (out[:, 0:1], out[:, 1:2]); slice paired arrays at the same rows"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
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
