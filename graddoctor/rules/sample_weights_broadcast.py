from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_SPAN = 40  # lines above a statement searched for the assignment of a name it reads
_VISITED = 24  # statements looked at, at most, from the backward


def _shape(shape) -> str:
    """(8, 1), (8,), ()"""
    dims = list(shape or ())
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant))


def _products(node: ast.AST) -> list[ast.BinOp]:
    """The ``*`` and ``/`` between two values neither of which is a literal number."""
    return [sub for sub in walk(node) if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Mult, ast.Div))
            and not _number(sub.left) and not _number(sub.right)]


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return [node for node in walk(tree) if isinstance(node, ast.stmt)
            and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For,
                                      ast.While, ast.If, ast.With, ast.Try))]


def _product_line(tree: ast.AST, line: int) -> tuple[int, list[ast.BinOp]] | None:
    """The line of the statement that multiplies (or divides) the loss's terms by a factor,
    searched from the backward on ``line`` back along what it reads: the statement itself, the
    latest assignment above it of each name it reads, the body of a function of the file it
    calls, and so on, with the statement's products; None when no statement there holds a
    product of two values."""
    simple = _statements(tree)
    start = [s for s in simple if s.lineno <= line <= (s.end_lineno or s.lineno)]
    if not start:
        return None
    functions: dict[str, list] = {}
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, []).append(node)
    queue, seen = [min(start, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)], set()
    while queue and len(seen) < _VISITED:
        stmt = queue.pop(0)
        if id(stmt) in seen:
            continue
        seen.add(id(stmt))
        if _products(stmt):
            return stmt.lineno, _products(stmt)
        for sub in walk(stmt):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                bound = [s for s in simple if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                         and stmt.lineno - _SPAN <= s.lineno < stmt.lineno
                         and any(isinstance(t, ast.Name) and t.id == sub.id
                                 for target in (s.targets if isinstance(s, ast.Assign) else [s.target])
                                 for t in walk(target))]
                if bound:
                    queue.append(max(bound, key=lambda s: s.lineno))
            elif isinstance(sub, ast.Call):
                name = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", None)
                defs = functions.get(name, [])
                if len(defs) == 1:
                    body = [s for s in walk(defs[0]) if isinstance(s, (ast.Return, ast.Assign))]
                    queue.extend(sorted(body, key=lambda s: -s.lineno))
    return None


class SampleWeightsBroadcast(Rule):
    """
    ## What it does
    Finds a product or quotient in the loss between per-sample values of two layouts — per-sample
    weights, advantages, a validity mask or importance weights of shape `(N,)` against the
    per-sample loss terms of shape `(N, 1)` (or the reverse, or `(B, H, W)` against
    `(B, 1, H, W)`) — which broadcast to `(N, N)`. It reads the loss's graph at the first
    backwards of each backward line, walking its pointwise top (sums, means, elementwise
    arithmetic and functions, views) and judging each product from the shapes the autograd
    nodes record, and points at the statement that computes the product (the loss's
    assignment, an assignment it reads, or the return of a loss function of the script).

    ## Why is this bad?
    `w * term` with `w` of shape `(N,)` and `term` of shape `(N, 1)` holds `w[j] * term[i]` for
    every pair: its sum is `sum(w) * sum(term)`. Each sample's term is weighted by the whole
    batch's factor instead of its own: sample weights and importance weights are averaged
    away, a mask no longer leaves anything out, and a policy gradient weighs every log-prob by
    the batch's mean advantage (about 0 once advantages are normalised). The loss is a number
    like any other and torch says nothing.

    ## Example
    ```python
    logits = model(x)  # (N, 1)
    per_sample = F.binary_cross_entropy_with_logits(logits, y, reduction="none")  # (N, 1)
    loss = (per_sample * weights).mean()  # weights: (N,)
    ```

    ## Use instead
    ```python
    loss = (per_sample.squeeze(1) * weights).mean()  # or weights.unsqueeze(1)
    ```

    ## Stays silent on
    Factors in the terms' own layout (`(N, 1)` with `(N, 1)`, `(N,)` with `(N,)`); broadcasts
    that grow along another axis (per-class weights `(C,)` against `(N, C)` terms, a `(N, 1)`
    column against `(N, C)`); pairwise terms built on purpose, whose two computed sides include
    a vector made a column (`s[:, None] * s`, `s.view(-1, 1)`), and `(N, N)` pairwise losses
    weighted by an `(N, N)` matrix; products by a number; differences (a hand-written
    regression error that broadcasts is `loss-shape-broadcast`'s); a factor whose shape graddoctor
    cannot read (saved under saved-tensor hooks). A `(N, 1)` term times a `(C,)` vector of
    another meaning whose length happens to equal the batch size would read as this bug.
    """

    code = "GD164"
    slug = "sample-weights-broadcast"
    severity = Severity.WARNING
    summary = ("per-sample weights, advantages or a mask of shape (N,) multiply loss terms of "
               "shape (N, 1): they broadcast to (N, N), every term weighted by every sample's factor")
    fix = "give the factor the terms' shape: term.squeeze(1) * w, or term * w.unsqueeze(1)"

    def check(self, a):
        for e in a.of_kind("factor_broadcast"):
            term, factor, shape = e.get("term_shape") or [], e.get("factor_shape") or [], e.get("shape") or []
            loc, sign = e.loc, "*" if e.get("op") == "mul" else "/"
            column = f"the {_shape(term if len(term) > len(factor) else factor)} one"
            flat = f"the {_shape(factor if len(term) > len(factor) else term)} one"
            axis = next((i for i, d in enumerate(term if len(term) > len(factor) else factor) if d == 1), 1)
            fix = (f"give the factor the terms' shape: .squeeze({axis}) {column} or "
                   f".unsqueeze({axis}) {flat}")
            tree = a.source.tree(loc.path) if loc is not None else None
            found = _product_line(tree, loc.line) if tree is not None else None
            if found is not None:
                loc = Location(loc.path, found[0])
                products = [p for p in found[1] if isinstance(p.op, ast.Mult if sign == "*" else ast.Div)]
                if len(products) == 1:
                    left, right = ast.unparse(products[0].left), ast.unparse(products[0].right)
                    fix = (f"make `{left}` and `{right}` one shape: .squeeze({axis}) {column} or "
                           f".unsqueeze({axis}) {flat}")
            yield self.finding(
                f"a loss term of shape {_shape(term)} is combined by '{sign}' with a per-sample "
                f"factor of shape {_shape(factor)}: they broadcast to {_shape(shape)}, so each "
                f"sample's term is weighted by every sample's factor instead of its own — the "
                f"per-sample weighting (weights, advantages, a mask) is averaged away",
                loc, step=a.next_step_number(e.seq),
                evidence={"op": e.get("op"), "term_shape": list(term), "factor_shape": list(factor),
                          "shape": list(shape), "factor_grad": bool(e.get("factor_grad"))},
                fix=fix)
