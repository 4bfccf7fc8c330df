"""A box-matching cost that adds an overlap (IoU, GIoU) instead of subtracting it, read from
the script's source (matching-cost-adds-overlap).

A bipartite matcher (DETR's Hungarian matcher, a hand-written greedy one) pairs predictions
with targets at the *lowest* cost: ``linear_sum_assignment(C)`` minimises unless it is given
``maximize=True``, and ``argsort``/``argmin``/``min`` pick the smallest. An IoU or GIoU is a
similarity (higher is better), so it enters a cost negated (``-giou``) or as ``1 - iou``.

The walk below looks, in each function (and the module's own statements), at the expressions a
minimiser reads: the matrix given to ``linear_sum_assignment`` without ``maximize=True``, the
tensor ``argsort`` (ascending), ``argmin`` or ``min`` is taken of, followed through the names
assigned in the same scope (``C = ...``, ``C = C.view(...).cpu()``). Its terms are read with
their signs (``a + b``, ``a - b``, ``-a``, ``w * a`` with a factor that is no overlap): a term
that is an overlap with a plus sign is reported, at the statement that adds it. An overlap is a
call of a function named for one (``box_iou``, ``generalized_box_iou``, ``giou``,
``bbox_overlaps``, ``jaccard``), or a name assigned one with a plus sign (``cost_giou =
generalized_box_iou(...)``, ``c = w * box_iou(...)``); a name assigned ``-giou`` or ``1 - iou``
is a cost.
"""

from __future__ import annotations

import ast
import re

from .source import scope_walk
from .source import walk

# a function computing an overlap of boxes or masks (higher: more alike)
_OVERLAP = re.compile(r"(^|_)([gdc]?iou|overlaps?|jaccard)($|_)", re.IGNORECASE)
_NOT_OVERLAP = re.compile(r"loss|cost|dist", re.IGNORECASE)
# methods that keep a matrix's values (moves, views, copies)
_KEEPS = frozenset({"cpu", "numpy", "detach", "view", "reshape", "float", "double", "clone",
                    "contiguous", "t", "to", "squeeze", "unsqueeze", "transpose", "permute",
                    "split", "chunk", "nan_to_num"})


def _last(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_overlap_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _last(node.func)
    return bool(_OVERLAP.search(name)) and not _NOT_OVERLAP.search(name)


def _strip(node: ast.AST) -> ast.AST:
    """The matrix under the methods and subscripts that keep its values (``C.cpu().numpy()``,
    ``cost[:, j]``, ``C.view(bs, q, -1)``)."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _KEEPS:
            node = node.func.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute) and node.attr in ("T", "mT", "data"):
            node = node.value
        else:
            return node


class _Scope:
    """The assignments of one scope, in order: name -> [(line, value)]."""

    def __init__(self, scope: ast.AST):
        self.assigned: dict[str, list[tuple[int, ast.AST, ast.stmt]]] = {}
        for node in scope_walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                self.assigned.setdefault(node.targets[0].id, []).append((node.lineno, node.value, node))
        for values in self.assigned.values():
            values.sort(key=lambda v: v[0])

    def value_of(self, name: str, line: int):
        """The value last assigned to ``name`` before ``line`` (its statement too)."""
        found = None
        for at, value, stmt in self.assigned.get(name, ()):
            if at < line:
                found = (at, value, stmt)
        return found


def _overlap_terms(expr: ast.AST, scope: _Scope, line: int, sign: int = 1, depth: int = 0):
    """``(sign, term)`` of each overlap among the terms of ``expr``: through sums, differences,
    negations and products with a factor (``2 * giou``, ``self.w * giou``) and, for a name,
    through its assignment before ``line`` in the scope."""
    if depth > 8:
        return
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        yield from _overlap_terms(expr.left, scope, line, sign, depth + 1)
        yield from _overlap_terms(expr.right, scope, line, -sign if isinstance(expr.op, ast.Sub)
                                  else sign, depth + 1)
    elif isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        yield from _overlap_terms(expr.operand, scope, line, -sign, depth + 1)
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)):
        for factor, term in ((expr.left, expr.right), (expr.right, expr.left)):
            if isinstance(expr.op, ast.Div) and term is expr.right:
                continue  # a / giou: no linear term
            if _plain_factor(factor):
                negative = isinstance(factor, ast.UnaryOp) and isinstance(factor.op, ast.USub) \
                    or isinstance(factor, ast.Constant) and isinstance(factor.value, (int, float)) \
                    and factor.value < 0
                yield from _overlap_terms(term, scope, line, -sign if negative else sign, depth + 1)
                return
    elif _is_overlap_call(_strip(expr)):
        yield sign, expr
    elif isinstance(_strip(expr), ast.Name):
        name = _strip(expr)
        found = scope.value_of(name.id, getattr(expr, "lineno", line))
        if found is not None:
            for s, _ in _overlap_terms(found[1], scope, found[0], sign, depth + 1):
                yield s, expr


def _plain_factor(node: ast.AST) -> bool:
    """A weight: a number, a name or attribute (``self.cost_giou``, ``w_giou``), negated or not."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
        or isinstance(node, ast.Attribute) or isinstance(node, ast.Name) \
        and not _OVERLAP.search(node.id)


def _minimised(node: ast.Call) -> ast.AST | None:
    """The matrix a call picks the smallest entries of, or None."""
    name = _last(node.func)
    keywords = {k.arg: k.value for k in node.keywords}
    if name == "linear_sum_assignment":
        maximize = keywords.get("maximize")
        if maximize is not None and not (isinstance(maximize, ast.Constant) and maximize.value is False):
            return None
        return node.args[0] if node.args else keywords.get("cost_matrix")
    if name in ("argsort", "sort"):
        descending = keywords.get("descending")
        if descending is not None and not (isinstance(descending, ast.Constant)
                                           and descending.value is False):
            return None
    if name not in ("argsort", "argmin", "min", "sort"):
        return None
    func = node.func
    library = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id in ("torch", "np", "numpy")
    if isinstance(func, ast.Attribute) and not library:
        return func.value  # cost.argmin(0), cost[:, j].argsort()
    if library and node.args:
        return node.args[0]  # torch.argsort(cost[:, j]), np.argmin(C)
    return None


def overlap_added_to_cost(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``(line, the overlap term's text, the minimiser's name, its line)`` for each overlap
    added with a plus sign to a cost a minimiser reads (see the module's docs). The line is the
    statement that adds it: the cost's assignment, or the minimiser's call when it is written
    inline."""
    found = []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        assigned = _Scope(scope)
        for node in scope_walk(scope):
            if not isinstance(node, ast.Call):
                continue
            matrix = _minimised(node)
            if matrix is None:
                continue
            base = _strip(matrix)
            line, expr = node.lineno, base
            if isinstance(base, ast.Name):
                made = assigned.value_of(base.id, node.lineno)
                if made is None:
                    continue
                line, expr = made[0], made[1]
                # `C = C.view(...).cpu()`: the statement that built it
                while isinstance(_strip(expr), ast.Name) and _strip(expr) is not expr \
                        and _strip(expr).id == base.id:
                    before = assigned.value_of(base.id, line)
                    if before is None:
                        break
                    line, expr = before[0], before[1]
            for sign, term in _overlap_terms(expr, assigned, line):
                if sign > 0:
                    found.append((line, ast.unparse(term), _last(node.func), node.lineno))
                    break
    return sorted(set(found))
