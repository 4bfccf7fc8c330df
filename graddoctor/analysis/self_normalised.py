"""A divisor that measures the size of the very values a loss term averages, read from the
script's source: ``lmbda = alpha / q.abs().mean()`` (TD3+BC's normalising lambda) with no
``.detach()`` / ``.item()`` — the statement loss-weight-from-loss points at when the loss's graph
shows a term divided by its own size with the divisor's graph kept."""

from __future__ import annotations

import ast

from .source import _enclosing_function, _parse, walk

_SIZES = frozenset({"mean", "sum", "norm"})
_CUTS = frozenset({"detach", "item", "detach_", "tolist", "numpy", "float"})


def _measured(node: ast.AST) -> str | None:
    """The name whose size ``node`` measures (``q.abs().mean()``, ``q.norm()``,
    ``torch.mean(torch.abs(q))``, ``q.abs().mean() + 1e-6``), or None; None as well when the
    expression cuts the graph (``.detach()``, ``.item()``)."""
    if any(isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _CUTS
           for sub in walk(node)):
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # + eps
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(other, ast.Constant):
                return _measured(side)
        return None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in _SIZES:
        return None
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id in ("torch", "th")):
        inner = func.value
    elif node.args:
        inner = node.args[0]
    else:
        return None
    if name == "norm":
        return inner.id if isinstance(inner, ast.Name) else None
    # mean / sum of |x| or x ** 2
    if isinstance(inner, ast.Call):
        f = inner.func
        inner_name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if inner_name == "abs":
            target = f.value if isinstance(f, ast.Attribute) and not (
                isinstance(f.value, ast.Name) and f.value.id in ("torch", "th")) else (inner.args[0] if inner.args else None)
            return target.id if isinstance(target, ast.Name) else None
    return None


def self_normalising_line(path: str, line: int) -> tuple[int, str, str] | None:
    """``(line, text, name)`` of the assignment nearest above ``line`` (the backward's), in its
    function, whose value divides by the size of a name (``alpha / q.abs().mean()``) without
    detaching the divisor; None when there is none."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    best = None
    for node in walk(scope):
        if not isinstance(node, ast.Assign) or node.lineno > line:
            continue
        for sub in walk(node.value):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div):
                name = _measured(sub.right)
                if name is not None and (best is None or node.lineno > best[0]):
                    best = (node.lineno, ast.unparse(node).strip(), name)
    return best
