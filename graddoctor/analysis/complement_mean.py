"""Masked means whose sum keeps the positions their count leaves out, read from the script's
source: ``(loss * (1 - mask)).sum(1) / mask.sum(1)``.

A masked mean sums a per-element value times a 0/1 mask and divides by the mask's count, the
same mask on both sides. When the numerator's mask is the complement of the one counted
(``1 - m``, ``~m``, ``m.logical_not()``, ``m == 0``, or a name assigned one of them), the loss
trains exactly the positions the mask was meant to drop (a prompt, padding, the tokens after
the stop token) and is scaled by the wrong count.
"""

from __future__ import annotations

import ast

from .source import _parse, scope_walk, walk


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover
        return ""


def _strip_cast(node: ast.AST) -> ast.AST:
    """``m.float()``, ``m.bool()``, ``m.to(x)`` read as ``m``."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("float", "bool", "long", "int", "half", "to", "type_as", "detach"):
        node = node.func.value
    return node


def _complement_of(node: ast.AST, complements: dict) -> str | None:
    """The mask's text when ``node`` is its complement, else None."""
    node = _strip_cast(node)
    if isinstance(node, ast.Name) and node.id in complements:
        return complements[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Constant) \
            and node.left.value in (1, 1.0) and not isinstance(node.left.value, bool):
        return _text(_strip_cast(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return _text(_strip_cast(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "logical_not" and not node.args:
            return _text(_strip_cast(node.func.value))
        if node.func.attr == "logical_not" and len(node.args) == 1 and _text(node.func.value) == "torch":
            return _text(_strip_cast(node.args[0]))
        if node.func.attr == "eq" and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == 0:
            return _text(_strip_cast(node.func.value))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq) \
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value == 0 \
            and not isinstance(node.comparators[0].value, bool):
        return _text(_strip_cast(node.left))
    return None


def _factors(node: ast.AST):
    """The factors of a product (nested ``*`` flattened)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        yield from _factors(node.left)
        yield from _factors(node.right)
    else:
        yield node


def _sum_call(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``(summed, its reduction arguments' text)`` for ``x.sum(...)`` / ``torch.sum(x, ...)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sum"):
        return None
    if _text(node.func.value) == "torch":
        if not node.args:
            return None
        rest = [_text(a) for a in node.args[1:]]
        return node.args[0], ",".join(rest + [_text(k) for k in node.keywords])
    return node.func.value, ",".join([_text(a) for a in node.args] + [_text(k) for k in node.keywords])


def _count_of(node: ast.AST) -> tuple[str, str] | None:
    """``(mask text, reduction arguments)`` for a count: ``m.sum(...)``, clamped or plus a
    constant, cast or not."""
    while True:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            node = node.left if not isinstance(node.left, ast.Constant) else node.right
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _text(node.func.value) == "torch" and node.func.attr in ("clamp", "clamp_min", "clip") and node.args:
            node = node.args[0]
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("clamp", "clamp_min", "clip", "float", "to"):
            node = node.func.value
            continue
        break
    found = _sum_call(node)
    if found is None:
        return None
    summed, dims = found
    summed = _strip_cast(summed)
    if not isinstance(summed, (ast.Name, ast.Attribute, ast.Subscript)):
        return None
    return _text(summed), dims


def _scopes(tree: ast.AST):
    yield tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` in source order, nested functions and classes left out."""
    return sorted(scope_walk(scope), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


def complement_masked_means(path: str) -> list[tuple[int, str, str]]:
    """``(line, the mask counted, the numerator's mask text)`` for each quotient whose numerator
    sums a product with the complement of a mask (inline or through one name assigned it) and
    whose denominator counts that mask, both reduced over the same axes."""
    tree = _parse(path)
    if tree is None:
        return []
    out = []
    for scope in _scopes(tree):
        complements: dict[str, str] = {}  # name -> the mask it is the complement of
        masked: dict[str, tuple[str, str, int]] = {}  # name -> (mask, the complement's text, line)
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                comp = _complement_of(node.value, complements)
                if comp is not None:
                    complements[name] = comp
                else:
                    complements.pop(name, None)
                product = None
                for factor in _factors(node.value):
                    inner = _complement_of(factor, complements)
                    if inner is not None and isinstance(node.value, ast.BinOp):
                        product = (inner, _text(factor), node.lineno)
                if product is not None:
                    masked[name] = product
                else:
                    masked.pop(name, None)
                continue
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
                continue
            top = _sum_call(node.left)
            count = _count_of(node.right)
            if top is None or count is None:
                continue
            summed, dims = top
            mask, count_dims = count
            if dims != count_dims:
                continue
            summed = _strip_cast(summed)
            found = None
            if isinstance(summed, ast.Name) and summed.id in masked:
                found = masked[summed.id]
            elif isinstance(summed, ast.BinOp) and isinstance(summed.op, ast.Mult):
                for factor in _factors(summed):
                    inner = _complement_of(factor, complements)
                    if inner is not None:
                        found = (inner, _text(factor), node.lineno)
            if found is None or found[0] != mask:
                continue
            line = found[2] if isinstance(summed, ast.Name) else node.lineno
            out.append((line, mask, found[1]))
    return sorted(set(out))
