"""What the user's source says around an event's line, for the few bugs no runtime event can
show: a method named without its call (``optimizer.zero_grad`` with no parentheses) runs nothing,
so the trace holds no trace of it. Read-only, cached, and silent on any failure (a file that is
gone, not Python, or a location that is not a file): the rules then fall back to the trace."""

from __future__ import annotations

import ast
import linecache
from functools import lru_cache


@lru_cache(maxsize=64)
def _tree(path: str, size: int) -> ast.AST | None:
    try:
        return ast.parse("".join(linecache.getlines(path)), filename=path)
    except Exception:
        return None


def _parse(path: str) -> ast.AST | None:
    lines = linecache.getlines(path)
    return _tree(path, len(lines)) if lines else None


def bare_method_lines(path: str, line: int, method: str, outer: bool = False) -> list[tuple[int, str]]:
    """The lines, inside the innermost loop that holds ``line``, of expression statements that
    name ``<something>.<method>`` without calling it (``optimizer.zero_grad``): they do nothing.
    Each as ``(line, its source text)``.
    ``outer``: search the outermost loop that holds ``line`` instead (a per-epoch call such as
    ``model.train()`` sits in the epoch loop, around the batch loop). Empty when the source
    cannot be read or ``line`` is in no loop."""
    tree = _parse(path)
    if tree is None:
        return []
    loop = None
    for node in ast.walk(tree):
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (loop is None or (node.lineno < loop.lineno if outer else node.lineno >= loop.lineno))):
            loop = node
    if loop is None:
        return []
    return sorted((node.lineno, ast.unparse(node.value)) for node in ast.walk(loop)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == method)


def assigned_object(path: str, line: int, attribute: str) -> str | None:
    """The source text of the object whose ``attribute`` the statement at ``line`` assigns
    (``opt`` in ``opt.lr = 1e-3``), so that a fix can name the script's own variable; None when
    the source cannot be read or holds no such assignment there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno == line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == attribute:
                    return ast.unparse(target.value)
    return None


def innermost_loop(path: str, line: int) -> tuple[int, int] | None:
    """``(first, last)`` line of the innermost ``for``/``while`` loop of ``path`` that holds
    ``line``, or None (no loop, or the file cannot be read)."""
    tree = _parse(path)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best[0]:
                best = (node.lineno, node.end_lineno or node.lineno)
    return best


@lru_cache(maxsize=16)
def _lr_lines(text: str) -> tuple[int, ...]:
    try:
        tree = ast.parse(text)
    except Exception:
        return ()
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "lr"):
                found.append(node.lineno)
    return tuple(sorted(set(found)))


def lr_assignment_lines(path: str) -> list[int]:
    """The lines of ``<something>["lr"] = ...`` (or ``*=``, ...) in the file: where a script
    writes a param group's learning rate itself. Empty when the source cannot be read.
    Keyed by the text (not the name: a relative name may stand for another file by now)."""
    try:
        linecache.checkcache(path)
        lines = linecache.getlines(path)
        return list(_lr_lines("".join(lines))) if lines else []
    except Exception:
        return []


def called_object(path: str, line: int, method: str) -> str | None:
    """The source text of the object whose ``method`` a call on ``line`` calls (``opt`` in
    ``opt.step()``, ``scaler`` in ``scaler.scale(loss).backward()``), so that a fix can name the
    script's own variables; None when the source cannot be read or holds no such call there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return ast.unparse(node.func.value)
    return None
