"""A tanh-squashed Gaussian's log-density written with its two halves at the same point, read
from the script's source: ``dist.log_prob(v)`` and the change of variables' correction
``log(1 - w ** 2 + eps)`` (or ``log1p(-w ** 2)``) in one function with ``v`` and ``w`` one name.

The density of ``a = tanh(u)`` is ``N(u; mu, sigma) / (1 - a ** 2)``: the Gaussian is evaluated
at the pre-squash value ``u`` and the correction at the squashed ``a``. SAC's sampler writes
``normal.log_prob(x_t) - log(1 - y_t ** 2)`` with ``y_t = tanh(x_t)``; behaviour cloning of
squashed actions writes ``normal.log_prob(atanh(a)) - log(1 - a ** 2)``. One name on both sides
is one of the two at the wrong point: the Gaussian fitted to squashed values (then squashed
again when acting), or the correction of a value never squashed."""

from __future__ import annotations

import ast

from .source import _parse, walk

_SQUARES = ("pow", "square")


def _squared_name(node: ast.AST) -> str | None:
    """``w`` of ``w ** 2``, ``w.pow(2)``, ``torch.square(w)``, ``w * w``; else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) \
            and node.right.value == 2 and isinstance(node.left, ast.Name):
        return node.left.id
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.left, ast.Name) \
            and isinstance(node.right, ast.Name) and node.left.id == node.right.id:
        return node.left.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "pow" and isinstance(node.func.value, ast.Name) and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == 2:
            return node.func.value.id
        if node.func.attr == "square" and node.args and isinstance(node.args[0], ast.Name):
            return node.args[0].id
    return None


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


def _corrected_name(node: ast.AST) -> str | None:
    """``w`` of ``log(1 - w ** 2 [+ eps])``, ``log(1 - w ** 2).sum(...)`` (the call itself),
    ``log1p(-w ** 2)``; else None."""
    name = _call_name(node)
    if name not in ("log", "log1p"):
        return None
    arg = node.args[0] if node.args else (node.func.value if isinstance(node.func, ast.Attribute)
                                         and not (isinstance(node.func.value, ast.Name)
                                                  and node.func.value.id in ("torch", "th", "np", "math"))
                                         else None)
    if arg is None:
        return None
    if name == "log1p":
        if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub):
            return _squared_name(arg.operand)
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult) and isinstance(arg.left, ast.UnaryOp) \
                and isinstance(arg.left.op, ast.USub):  # -x * x
            return _squared_name(ast.BinOp(left=arg.left.operand, op=ast.Mult(), right=arg.right))
        return None
    # 1 - w ** 2 (+ eps), (1 - w ** 2) + eps, 1 + eps - w ** 2
    while isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and isinstance(arg.right, (ast.Constant, ast.Name)):
        arg = arg.left  # + eps
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Sub):
        left = arg.left
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
            if not (isinstance(left.right, ast.Constant) or isinstance(left.left, ast.Constant)):
                return None
            left = left.left if isinstance(left.left, ast.Constant) else left.right
        if isinstance(left, ast.Constant) and left.value == 1:
            return _squared_name(arg.right)
    return None


def _log_prob_names(scope: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of each ``X.log_prob(name)`` call in ``scope``."""
    out = []
    for node in walk(scope):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "log_prob" \
                and len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            out.append((node.lineno, node.args[0].id))
    return out


def _aliases(scope: ast.AST) -> dict[str, tuple[str, ast.stmt]]:
    """``b -> (a, statement)`` for plain renames ``b = a`` and value-keeping calls ``b =
    a.clamp(...)``, ``b = torch.clamp(a, ...)`` in ``scope`` (a tanh or atanh between them is
    no alias)."""
    out = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Name):
                out[node.targets[0].id] = (value.id, node)
            elif _call_name(value) in ("clamp", "clip", "detach", "float", "to"):
                inner = value.func.value if isinstance(value.func, ast.Attribute) else None
                if isinstance(inner, ast.Name) and inner.id in ("torch", "th", "np"):
                    inner = value.args[0] if value.args else None
                if isinstance(inner, ast.Name):
                    out[node.targets[0].id] = (inner.id, node)
    return out


def _root(name: str, aliases: dict) -> str:
    for _ in range(8):
        if name not in aliases:
            return name
        name = aliases[name][0]
    return name


def _sampled(name: str, scope: ast.AST) -> bool:
    """Whether ``name`` is assigned a distribution's draw (``normal.rsample()``, ``.sample()``)
    in ``scope``: the pre-squash value, so the correction is the half at the wrong point."""
    for node in walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and _call_name(node.value) in ("rsample", "sample"):
            return True
    return False


def squash_corrections_mismatched(path: str) -> list[tuple[int, str, str, str]]:
    """``(line, text, name, half)`` for each tanh correction ``log(1 - name ** 2)`` whose
    function also evaluates a distribution's ``log_prob`` at ``name`` (or a plain alias of it):
    the statement to change and which half is at the wrong point (``"gaussian"``: the
    ``log_prob`` call, or the alias that should have been ``atanh``; ``"correction"``: the
    correction of a value drawn from the Gaussian and never squashed)."""
    tree = _parse(path)
    if tree is None:
        return []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out, seen = [], set()
    for scope in [tree, *scopes]:
        body_nodes = scope.body if not isinstance(scope, ast.Module) else [
            s for s in scope.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        wrapper = ast.Module(body=body_nodes, type_ignores=[])
        log_probs = _log_prob_names(wrapper)
        if not log_probs:
            continue
        aliases = _aliases(wrapper)
        evaluated = {_root(name, aliases): (line, name) for line, name in log_probs}
        statements = {n.lineno: n for n in walk(wrapper) if isinstance(n, ast.stmt)}
        for stmt in walk(wrapper):
            if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr)):
                continue
            for node in walk(stmt):
                corrected = _corrected_name(node)
                if corrected is None:
                    continue
                root = _root(corrected, aliases)
                if root not in evaluated:
                    continue
                line, name = evaluated[root]
                if _sampled(root, wrapper) and name == root:
                    where, half = stmt, "correction"
                elif name != root and name in aliases:  # u = a where u = atanh(a) was meant
                    where, half = aliases[name][1], "gaussian"
                else:
                    where, half = statements.get(line, stmt), "gaussian"
                if where.lineno not in seen:
                    seen.add(where.lineno)
                    out.append((where.lineno, ast.unparse(where).strip(), corrected, half))
    return sorted(out)
