"""Running normalisers fed their own output, read from the script's source: ``rms.update(y)``
where ``y`` is (inline, or through the name's latest assignment before the call in the same
scope) computed from the same normaliser's statistics (``(x - rms.mean) / rms.var.sqrt()``) or
its normalising method (``rms.normalize(x)``)."""

from __future__ import annotations

import ast

from .source import _parse, walk
from .source import scope_walk as _own_nodes

_UPDATES = frozenset({"update", "push", "update_stats", "update_from_moments"})
_STATS = frozenset({"mean", "var", "std", "mu", "sigma", "running_mean", "running_var"})
_APPLY = frozenset({"normalize", "normalise", "transform", "apply", "norm", "__call__"})


def _reads_stats(expr: ast.AST, owner: str) -> bool:
    for sub in walk(expr):
        if isinstance(sub, ast.Attribute) and sub.attr in _STATS and ast.unparse(sub.value) == owner:
            return True
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Attribute) and f.attr in _APPLY and ast.unparse(f.value) == owner:
                return True
            if ast.unparse(f) == owner:
                return True
    return False


def _scopes(tree: ast.AST):
    yield tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def normaliser_fed_own_output(path: str) -> list[tuple[int, str, str, int | None]]:
    """``(line, the update call's text, the normaliser's text, the line that normalised the
    argument or None when inline)`` for each update of a running normaliser whose argument is
    already normalised by it."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for scope in _scopes(tree):
        nodes = list(_own_nodes(scope))
        assigns: dict[str, list[tuple[int, ast.AST]]] = {}
        for node in nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        assigns.setdefault(t.id, []).append((node.lineno, node.value))
        for node in nodes:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _UPDATES and len(node.args) >= 1):
                continue
            owner = ast.unparse(node.func.value)
            arg = node.args[0]
            if _reads_stats(arg, owner):
                found.append((node.lineno, ast.unparse(node), owner, None))
                continue
            base = arg
            while isinstance(base, (ast.Subscript, ast.Call)) and not (
                    isinstance(base, ast.Call) and not isinstance(base.func, ast.Attribute)):
                base = base.value if isinstance(base, ast.Subscript) else base.func.value
            if not isinstance(base, ast.Name):
                continue
            before = [(ln, v) for ln, v in assigns.get(base.id, []) if ln < node.lineno]
            if before:
                ln, value = max(before, key=lambda p: p[0])
                if _reads_stats(value, owner):
                    found.append((node.lineno, ast.unparse(node), owner, ln))
    return sorted(set(found))
