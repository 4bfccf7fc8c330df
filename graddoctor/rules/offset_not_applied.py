from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles every parsed node
        return ""


def _own(nodes):
    """The nodes under ``nodes``, outside the functions, classes and lambdas nested in them."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _names(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def _is_zero(node: ast.AST | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value == 0)


def _slices(sub: ast.Subscript):
    index = sub.slice
    for part in (index.elts if isinstance(index, ast.Tuple) else [index]):
        if isinstance(part, ast.Slice) and part.step is None:
            yield part


def _zeroed_before(block: list[ast.stmt], loop: ast.stmt, name: str) -> bool:
    """Whether the statements of ``block`` before ``loop`` set ``name`` to 0 (a cursor's start)."""
    for stmt in block:
        if stmt is loop:
            return False
        found = False
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    found = found or _is_zero(stmt.value)
                elif isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
                        and len(target.elts) == len(stmt.value.elts):
                    found = found or any(isinstance(t, ast.Name) and t.id == name and _is_zero(v)
                                         for t, v in zip(target.elts, stmt.value.elts))
        if found:
            # a later statement of the block before the loop may still rebind it
            rest = block[block.index(stmt) + 1:block.index(loop)]
            if not any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name
                       for s in rest for n in walk(s)):
                return True
    return False


def _read_after(block: list[ast.stmt], loop: ast.stmt, name: str) -> bool:
    """Whether a statement of ``block`` after ``loop`` reads ``name``: a total counted for later
    (``correct / total``), not an offset into the pieces."""
    rest = block[block.index(loop) + 1:]
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id == name
               for stmt in rest for n in walk(stmt))


def _blocks(tree: ast.AST):
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _statement_of(loop: ast.stmt, node: ast.AST) -> ast.stmt:
    best = loop
    for stmt in _own(loop.body):
        if isinstance(stmt, ast.stmt) and not isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)) \
                and any(n is node for n in walk(stmt)):
            return stmt
    return best


def offsets_not_applied(tree: ast.AST) -> list[dict]:
    """Running offsets into a flat tensor that the loop's slices never apply:

    - ``unread``: a cursor set to 0 before a loop and advanced in it (``off += n``) that nothing
      in the loop or after it reads, while the loop slices a flat tensor from the start by the
      same size (``flat[:n]``, one slice as the whole index): every pass reads the first ``n``
      values;
    - ``frozen``: a window ``flat[off:off + n]`` read in a loop whose cursor, set to 0 before the
      loop, the loop never advances: every pass reads the same window.

    A window taken from a tensor the loop rebinds (``buf = buf[n:]``, consuming it) is no such
    case."""
    found = []
    seen: set[int] = set()
    for block in _blocks(tree):
        for loop in block:
            if not isinstance(loop, (ast.For, ast.While)):
                continue
            inner = list(_own(loop.body))
            header = list(_own([loop.test])) if isinstance(loop, ast.While) else list(_own([loop.iter]))
            stored = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            stored |= _names(loop.target) if isinstance(loop, ast.For) else set()
            advanced = {}
            for n in inner:
                if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and isinstance(n.target, ast.Name):
                    advanced.setdefault(n.target.id, []).append(n)
            loads = {}
            for n in inner + header:
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    loads[n.id] = loads.get(n.id, 0) + 1
            for sub in (n for n in inner if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)):
                base = sub.value
                if isinstance(base, ast.Name) and base.id in stored:
                    continue  # a buffer the loop consumes and rebinds
                for part in _slices(sub):
                    # unread: flat[:n] while `off += n` advances a cursor nothing reads
                    if _is_zero(part.lower) and part.upper is not None and part is sub.slice:
                        for cursor, steps in advanced.items():
                            if loads.get(cursor) or not _zeroed_before(block, loop, cursor) \
                                    or _read_after(block, loop, cursor):
                                continue
                            size = set().union(*(_names(s.value) for s in steps))
                            if not size or not (_names(part.upper) & size) or id(sub) in seen:
                                continue
                            seen.add(id(sub))
                            stmt = _statement_of(loop, sub)
                            step = steps[0]
                            found.append({"line": stmt.lineno, "kind": "unread", "cursor": cursor,
                                          "window": _text(sub), "advance_line": step.lineno,
                                          "size": _text(step.value),
                                          "fixed": _text(ast.Subscript(base, ast.Slice(
                                              ast.Name(cursor, ast.Load()),
                                              ast.BinOp(ast.Name(cursor, ast.Load()), ast.Add(), step.value),
                                              None), ast.Load()))})
                    # frozen: flat[off:off + n] with `off` never advanced in the loop
                    lower = part.lower
                    if isinstance(lower, ast.Name) and lower.id not in stored \
                            and isinstance(part.upper, ast.BinOp) and isinstance(part.upper.op, ast.Add) \
                            and _text(part.upper.left) == lower.id and id(sub) not in seen \
                            and _zeroed_before(block, loop, lower.id):
                        seen.add(id(sub))
                        stmt = _statement_of(loop, sub)
                        found.append({"line": stmt.lineno, "kind": "frozen", "cursor": lower.id,
                                      "window": _text(sub), "size": _text(part.upper.right)})
    return sorted(found, key=lambda h: h["line"])


class OffsetNotApplied(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a loop that cuts a flat
    tensor into pieces with a running offset and does not use it: the offset is set to 0
    before the loop and advanced in it (`off += n`) while the loop's slice reads from the
    start (`flat[:n]`) and nothing reads the offset; or the slice reads at the offset
    (`flat[off:off + n]`) and the loop never advances it. It points at the slice.

    ## Why is this bad?
    Unflattening a vector into pieces (a hypernetwork's output into a target network's
    weights and biases, a merged gradient back into each parameter's `.grad`, a packed buffer
    into per-sample segments) needs each piece to start where the previous one ended. With
    the offset left out, every piece is a view of the same first values: the generated biases
    are copies of the first weights, every parameter gets the first parameter's gradient
    (reshaped), every segment is the first sample. Shapes still agree, so nothing raises, and
    training goes on with tied, wrong pieces.

    ## Example
    ```python
    off = 0
    for shape in shapes:
        n = math.prod(shape)
        params.append(flat[:n].view(shape))
        off += n
    ```

    ## Use instead
    ```python
    off = 0
    for shape in shapes:
        n = math.prod(shape)
        params.append(flat[off:off + n].view(shape))
        off += n
    ```

    ## Stays silent on
    A slice at the offset (`flat[off:off + n]`) with the offset advanced; a buffer the loop
    consumes and rebinds (`buf = buf[n:]`); `torch.split(flat, sizes)`; an offset read
    anywhere else in the loop (`flat.narrow(0, off, n)`); a count read after the loop (`total
    += n` beside `tags[b, :n]`, then `correct / total`); a prefix of a row (`x[b, :n]`); a
    window that only reuses a name that is not a cursor set to 0 before the loop.
    """

    code = "GD295"
    slug = "offset-not-applied"
    severity = Severity.WARNING
    summary = ("a loop cuts a flat tensor into pieces with a running offset it never applies: "
               "every piece is the same first values")
    fix = "slice at the running offset and advance it: flat[off:off + n], then off += n"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in offsets_not_applied(tree):
                cursor, window = hit["cursor"], hit["window"]
                if hit["kind"] == "unread":
                    yield self.finding(
                        f"`{window}` reads from the start at every pass of the loop, while "
                        f"`{cursor} += {hit['size']}` (line {hit['advance_line']}) advances an "
                        f"offset nothing reads: every piece cut here is the same first values "
                        f"(weights and biases tied, every parameter given the first one's values)",
                        Location(path, hit["line"]),
                        evidence={"kind": "unread", "cursor": cursor, "window": window},
                        fix=f"slice at the offset: `{hit['fixed']}`")
                else:
                    yield self.finding(
                        f"`{window}` reads at `{cursor}`, which is 0 before the loop and never "
                        f"advanced in it: every pass reads the same window, so every piece cut "
                        f"here is the same values",
                        Location(path, hit["line"]),
                        evidence={"kind": "frozen", "cursor": cursor, "window": window},
                        fix=f"advance the offset after the slice: `{cursor} += {hit['size']}`")
