"""Straight-through estimators written with their signs swapped, read from the script's source:
a sum that adds a value's detached copy and subtracts the value itself (``hard + soft.detach() -
soft``), where the estimator adds the value and subtracts its detached copy (``hard + soft -
soft.detach()``): the forward value is the same, and the gradient reaching ``soft`` is negated."""

from __future__ import annotations

import ast

from .source import _parse, walk

# calls that stop the gradient of their one argument, besides ``x.detach()``
_STOP_CALLS = frozenset({"sg", "stop_gradient", "stop_grad", "detach"})


def _stopped(node: ast.AST) -> ast.AST | None:
    """The expression whose gradient ``node`` stops (``x`` of ``x.detach()``, ``sg(x)``,
    ``x.data``), or None."""
    if isinstance(node, ast.Call) and not node.keywords:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "detach" and not node.args:
            return f.value
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name in _STOP_CALLS and len(node.args) == 1:
            return node.args[0]
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return node.value
    return None


def _terms(node: ast.AST, sign: int, stopped: bool, out: list) -> None:
    """The signed terms of a chain of sums and differences, a stop-gradient over a sum spread
    over its terms: ``(sign, stopped, text)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        _terms(node.left, sign, stopped, out)
        _terms(node.right, sign if isinstance(node.op, ast.Add) else -sign, stopped, out)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _terms(node.operand, -sign, stopped, out)
        return
    inner = _stopped(node)
    if inner is not None:
        _terms(inner, sign, True, out)
        return
    out.append((sign, stopped, ast.unparse(node)))


def reversed_straight_through(path: str) -> list[tuple[int, str, str]]:
    """``(line, the sum's text, the value's text)`` for each sum of the file (outermost only)
    holding three terms or more, one of which is a value ``v`` subtracted while its detached copy
    is added, with no other ``+v`` term to make up for it. Sums of two terms (``v.detach() - v``,
    a zero whose gradient is wanted negated) and terms with a factor (``2 * v.detach() - v``) are
    left out."""
    tree = _parse(path)
    if tree is None:
        return []
    inner_sums = set()
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))) or id(node) in inner_sums:
            continue
        for sub in walk(node):
            if sub is not node and isinstance(sub, ast.BinOp):
                inner_sums.add(id(sub))
        terms: list = []
        _terms(node, 1, False, terms)
        if len(terms) < 3:
            continue
        for sign, stopped, text in terms:
            if not stopped or sign != 1:
                continue
            plain = [s for s, st, t in terms if not st and t == text]
            if plain and sum(plain) < 0 and any(t != text for _, _, t in terms):
                found.append((node.lineno, ast.unparse(node), text))
                break
    return sorted(set(found))
