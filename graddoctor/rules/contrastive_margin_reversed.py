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


def reversed_margins(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, the hinged term, the distance)`` of each contrastive sum ``X * d ** 2 + (1 - X)
    * relu(d - margin) ** 2`` (either indicator first): the pairs whose distance is pulled
    without a margin are the similar ones, so the other pairs, the dissimilar ones, are the
    ones hinged, and a hinge on ``d - margin`` pulls them together once they are farther apart
    than the margin."""
    found = []
    for node in ast.walk(tree):
        terms = _terms(node) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) else []
        if len(terms) != 2:
            continue
        parts = []
        for term in terms:
            factors = _factors(term)
            hinge = next((h for f in factors if (h := _hinge(f)) is not None), None)
            rest = [f for f in factors if _hinge(f) is None]
            parts.append((term, hinge, rest))
        plain = [p for p in parts if p[1] is None]
        hinged = [p for p in parts if p[1] is not None]
        if len(plain) != 1 or len(hinged) != 1:
            continue
        (_, _, plain_rest), (term, hinge, hinged_rest) = plain[0], hinged[0]
        texts = {ast.unparse(f) for f in plain_rest}
        complementary = any(
            (c := _complement(f)) is not None and ast.unparse(c) in texts for f in hinged_rest) or any(
            (c := _complement(f)) is not None and ast.unparse(c) in {ast.unparse(g) for g in hinged_rest}
            for f in plain_rest)
        if not complementary:
            continue
        distance = ast.unparse(hinge.left)
        # the plain term pulls the same distance (d, d ** 2, d.pow(2)): the similar pairs
        if not any(ast.unparse(n) == distance for f in plain_rest for n in ast.walk(f)):
            continue
        found.append((node.lineno, ast.unparse(term), distance))
    return found


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
