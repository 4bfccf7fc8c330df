"""Where a hand-written log-likelihood is used without its minus: the statement that weighs or
reduces picked log-probabilities (``loss = (1 - p_t) ** g * logp_t``) with no negation in it."""

from __future__ import annotations

import ast
import linecache
from functools import lru_cache

_REDUCE = {"mean", "sum", "nanmean"}


@lru_cache(maxsize=16)
def _tree(text: str):
    try:
        return ast.parse(text)
    except Exception:
        return None


def _lines(path: str) -> list[str]:
    """The file's lines as they ran (keyed by the text, as ``source._parse``: a name may stand
    for another file by now)."""
    try:
        linecache.checkcache(path)
        return linecache.getlines(path)
    except Exception:
        return []


def _is_log_softmax(node) -> bool:
    """A call whose function is named ``log_softmax`` (``F.log_softmax(x, 1)``, ``x.log_softmax(1)``)."""
    return isinstance(node, ast.Call) and (
        getattr(node.func, "attr", None) == "log_softmax" or getattr(node.func, "id", None) == "log_softmax")


def _reads(node, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _picks(node, logs: set[str]) -> bool:
    """A ``gather`` or subscript of a log-softmax (inline or a name bound to one)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "gather" \
                and isinstance(n.func, ast.Attribute) \
                and (_is_log_softmax(n.func.value) or _reads(n.func.value, logs)):
            return True
        if isinstance(n, ast.Subscript) and (_is_log_softmax(n.value) or
                                             (isinstance(n.value, ast.Name) and n.value.id in logs)):
            return True
    return False


def unsigned_loglik_line(path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the first statement of ``path`` that multiplies, divides or reduces a
    name bound to picked log-probabilities (a ``gather``/subscript of a ``log_softmax``) and holds
    no negation; None when there is none."""
    lines = _lines(path)
    tree = _tree("".join(lines)) if lines else None
    if tree is None:
        return None
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        body = [s for s in ast.walk(scope) if isinstance(s, (ast.Assign, ast.Return, ast.AugAssign))]
        body.sort(key=lambda s: s.lineno)
        logs: set[str] = set()
        picked: set[str] = set()
        for stmt in body:
            value = stmt.value
            if value is None:
                continue
            targets = [t.id for t in getattr(stmt, "targets", [getattr(stmt, "target", None)])
                       if isinstance(t, ast.Name)]
            if _is_log_softmax(value):
                logs.update(targets)
                continue
            if _picks(value, logs) and not any(isinstance(n, ast.BinOp) for n in ast.walk(value)):
                picked.update(targets)
                continue
            if not picked or any(isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)
                                 for n in ast.walk(value)):
                continue
            for n in ast.walk(value):
                used = (isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Div))
                        and (_reads(n.left, picked) and not isinstance(n.left, ast.BinOp)
                             or _reads(n.right, picked) and not isinstance(n.right, ast.BinOp))) \
                    or (isinstance(n, ast.Call) and getattr(n.func, "attr", None) in _REDUCE
                        and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                        and n.func.value.id in picked)
                if used and not any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)
                                    and _reads(b.right, picked) for b in ast.walk(value)):
                    return stmt.lineno, lines[stmt.lineno - 1].strip()
    return None
