from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule


def _last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _complement(node: ast.AST) -> ast.AST | None:
    """``X`` of ``1 - X`` (``1.0 - X``), else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
            and isinstance(node.left, ast.Constant) and node.left.value in (1, 1.0):
        return node.right
    return None


def _factors(node: ast.AST) -> list[ast.AST]:
    """The operands of a product chain ``a * b * c``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _hinge(node: ast.AST) -> ast.BinOp | None:
    """The ``a - b`` inside ``relu(a - b)``, ``clamp(a - b, min=0)``, ``clamp_min(a - b, 0)``
    (through ``.pow(2)`` and ``** 2``), else None."""
    while True:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            node = node.left
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("pow", "square"):
            node = node.func.value
        else:
            break
    if isinstance(node, ast.Call) and _last_name(node) in ("relu", "clamp", "clamp_min", "hinge") \
            and node.args and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Sub):
        if _last_name(node) == "clamp" and not any(k.arg == "min" for k in node.keywords) \
                and len(node.args) < 2:
            return None
        return node.args[0]
    return None


def _terms(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _statements(body: list) -> list[ast.stmt]:
    """A scope's statements in source order, the bodies of its loops, branches and ``with``
    blocks included (not those of nested functions or classes: scopes of their own)."""
    out = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            out.extend(_statements(getattr(stmt, field, None) or []))
        for handler in getattr(stmt, "handlers", None) or []:
            out.extend(_statements(handler.body))
    return out


def _scopes(tree: ast.AST) -> list[list]:
    """The module's body and each function's, as lists of statements."""
    scopes = [tree.body] if isinstance(tree, ast.Module) else []
    scopes.extend(node.body for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return scopes


def _reversed_sum(node: ast.BinOp, bound: dict) -> tuple[int, str, str] | None:
    """``(line, the hinged term, the distance)`` when the sum ``node`` is a contrastive loss
    with its dissimilar pairs hinged on ``d - margin`` (see ``reversed_margins``); a term that is
    a name bound in the scope (``pos + neg``) is read as the value bound to it, its line the
    binding's."""
    parts = []
    for term in _terms(node):
        line = node.lineno
        if isinstance(term, ast.Name) and term.id in bound:
            line, term = bound[term.id]
        factors = _factors(term)
        hinge = next((h for f in factors if (h := _hinge(f)) is not None), None)
        rest = [f for f in factors if _hinge(f) is None]
        parts.append((term, hinge, rest, line))
    if len(parts) != 2:
        return None
    plain = [p for p in parts if p[1] is None]
    hinged = [p for p in parts if p[1] is not None]
    if len(plain) != 1 or len(hinged) != 1:
        return None
    (_, _, plain_rest, _), (term, hinge, hinged_rest, line) = plain[0], hinged[0]
    texts = {ast.unparse(f) for f in plain_rest}
    complementary = any(
        (c := _complement(f)) is not None and ast.unparse(c) in texts for f in hinged_rest) or any(
        (c := _complement(f)) is not None and ast.unparse(c) in {ast.unparse(g) for g in hinged_rest}
        for f in plain_rest)
    if not complementary:
        return None
    distance = ast.unparse(hinge.left)
    # the plain term pulls the same distance (d, d ** 2, d.pow(2)): the similar pairs
    if not any(ast.unparse(n) == distance for f in plain_rest for n in ast.walk(f)):
        return None
    return line, ast.unparse(term), distance


def reversed_margins(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, the hinged term, the distance)`` of each contrastive sum ``X * d ** 2 + (1 - X)
    * relu(d - margin) ** 2`` (either indicator first), written in one expression or as two
    names bound before the sum in its scope (``pos = ...; neg = ...; (pos + neg).mean()``): the
    pairs whose distance is pulled without a margin are the similar ones, so the other pairs,
    the dissimilar ones, are the ones hinged, and a hinge on ``d - margin`` pulls them together
    once they are farther apart than the margin."""
    found: dict = {}
    for body in _scopes(tree):
        bound: dict = {}  # name -> (line, value) of its last binding so far
        for stmt in _statements(body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("value", "test", "iter"):
                expr = getattr(stmt, field, None)
                if not isinstance(expr, ast.AST):
                    continue
                for node in ast.walk(expr):
                    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                        hit = _reversed_sum(node, bound)
                        if hit is not None:
                            found.setdefault(hit[0], hit)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                bound[stmt.targets[0].id] = (stmt.lineno, stmt.value)
            elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
                bound.pop(stmt.target.id, None)
    return [found[line] for line in sorted(found)]


class ContrastiveMarginReversed(Rule):
    """
    ## What it does
    Finds a contrastive (Siamese) loss whose margin term is turned around:
    `same * d ** 2 + (1 - same) * relu(d - margin) ** 2`. The similar pairs are the ones whose
    distance the loss pulls in without a margin; the other indicator marks the dissimilar pairs,
    and their hinge on `d - margin` pulls them together once they are farther apart than the
    margin, where `relu(margin - d)` pushes them out to it. It reads the source of the files a
    backward ran from.

    ## Why is this bad?
    Both kinds of pairs are pulled together: nothing ever pushes two classes apart, and the
    embedding collapses toward a point (the loss falls all the same). At initialisation most
    dissimilar pairs are closer than the margin, so the hinge is 0 and the gradient shows
    nothing wrong in the first steps.

    ## Example
    ```python
    d = F.pairwise_distance(z1, z2)
    loss = (same * d.pow(2) + (1 - same) * F.relu(d - margin).pow(2)).mean()
    ```

    ## Use instead
    ```python
    loss = (same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2)).mean()
    ```

    The two terms may be written in one expression or bound to names first (`pos = ...`,
    `neg = ...`, `(pos + neg).mean()`); the finding then points at the hinged term's binding.

    ## Stays silent on
    `relu(margin - d)` on the dissimilar pairs; a double-margin loss whose similar pairs are
    hinged on `d - m_pos` and dissimilar ones on `m_neg - d` (both terms hinged); a sum whose two
    indicators are not one and one minus the other.
    """

    code = "GD335"
    slug = "contrastive-margin-reversed"
    severity = Severity.WARNING
    summary = ("a contrastive loss hinges the dissimilar pairs on d - margin: they are pulled "
               "together beyond the margin instead of pushed out to it")
    fix = "hinge the dissimilar pairs on margin - d: `(1 - same) * F.relu(margin - d) ** 2`"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, term, distance in reversed_margins(tree):
                yield self.finding(
                    f"`{term}` hinges the dissimilar pairs on `{distance}` minus the margin: the "
                    f"other term pulls the similar pairs' `{distance}` in with no margin, and "
                    f"this one pulls the dissimilar pairs together as soon as they are farther "
                    f"apart than the margin. Nothing pushes them apart, so the embedding "
                    f"collapses",
                    Location(path, line), evidence={"term": term, "distance": distance},
                    fix=f"turn the hinge around: the margin minus `{distance}` "
                        f"(`F.relu(margin - {distance})`)")
