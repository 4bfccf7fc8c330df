"""Q-learning predictions taken as the maximum over the actions, read from the script's source:
``chosen = q.max(dim=-1)[0]`` of the online network's Q-values, with gradient, reaching the loss,
where the prediction is the Q-value of the action taken (``q.gather(-1, actions)``)."""

from __future__ import annotations

import ast
import re

from .source import _is_loss_call, _parse, _under_no_grad, walk

# the words of a value that is the bootstrap side of the target, where the maximum belongs
_TARGET_WORDS = frozenset({"next", "target", "targets", "tgt", "targ", "nxt", "bootstrap", "max",
                           "best", "greedy", "tq", "eval", "y"})
_Q_WORDS = frozenset({"q", "qs", "qvals", "qvalues", "qval", "qsa"})
_LOSS_NAMES = ("loss", "td", "delta", "error", "err")


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"_|(?<=[a-z])(?=[A-Z])|\d", name.lower()) if w}


def _base_name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
                and node.func.attr in ("float", "squeeze", "clone", "contiguous"):
            node = node.func.value
        elif isinstance(node, ast.Name):
            return node.id
        elif isinstance(node, ast.Attribute):
            return node.attr
        else:
            return None


def _max_values_of(expr: ast.AST) -> ast.AST | None:
    """``X`` of ``X.max(d)[0]``, ``X.max(dim=d).values``, ``torch.max(X, d)[0]`` and
    ``X.amax(d)``; None for anything else (a detach in the chain included)."""
    node = expr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
        node = node.value
    elif isinstance(node, ast.Attribute) and node.attr == "values":
        node = node.value
    elif not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "amax"):
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    f = node.func
    if f.attr not in ("max", "amax") or any(k.arg == "keepdim" for k in node.keywords):
        return None  # a kept axis is a stabiliser subtracted back (log-sum-exp), not a prediction
    module = isinstance(f.value, ast.Name) and f.value.id == "torch"
    args = node.args[1:] if module else node.args
    dims = [k.value for k in node.keywords if k.arg == "dim"] + list(args[:1])
    if len(dims) != 1 or not _action_axis(dims[0]):
        return None
    return node.args[0] if module else f.value


def _action_axis(dim: ast.AST) -> bool:
    """An axis after the batch's: a literal other than 0 (the actions', not the samples')."""
    if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and isinstance(dim.operand, ast.Constant):
        return True
    return isinstance(dim, ast.Constant) and isinstance(dim.value, int) and dim.value > 0


def _scopes(tree):
    yield tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _statements(scope):
    """The statements of ``scope`` outside nested functions and classes, in line order."""
    found, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.stmt):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _shifted(name: str, before: list) -> bool:
    """Whether the last assignment of ``name`` in ``before`` adds or subtracts a term
    (``q_margin = q + margin``): the maximum of such a sum is a loss of its own."""
    for st in reversed(before):
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
            return isinstance(st.value, ast.BinOp) and isinstance(st.value.op, (ast.Add, ast.Sub))
    return False


def greedy_q_predictions(path: str) -> list[tuple[int, str, str, int]]:
    """``(line, the statement's text, the Q-values' name, the loss line)`` for each assignment,
    outside ``no_grad``, of the maximum over an axis of Q-values with gradient (a name of Q
    words, no word of the bootstrap side, no detach) to a name of no bootstrap word, which
    reaches a loss call (or a name of a loss, a TD error) later in the same scope."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for scope in _scopes(tree):
        statements = _statements(scope)
        for i, st in enumerate(statements):
            if not isinstance(st, ast.Assign) or len(st.targets) != 1 or not isinstance(st.targets[0], ast.Name):
                continue
            target = st.targets[0].id
            q = _max_values_of(st.value)
            qname = _base_name(q) if q is not None else None
            if not qname or not (_words(qname) & _Q_WORDS) or (_words(qname) | _words(target)) & _TARGET_WORDS:
                continue
            if any(isinstance(n, ast.Attribute) and n.attr == "detach" for n in walk(st.value)):
                continue
            if _shifted(qname, statements[:i]):
                continue  # a max of Q plus a margin (DQfD's large-margin loss): not a prediction
            if _under_no_grad(tree, st):
                continue
            flowing, loss_line = {target}, None
            for later in statements[i + 1:]:
                if isinstance(later, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == target for t in later.targets):
                    break  # rebound
                reads = {n.id for n in walk(later) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                if not reads & flowing:
                    continue
                if any(_is_loss_call(n) for n in walk(later)):
                    loss_line = later.lineno
                    break
                if isinstance(later, ast.Assign):
                    names = [t.id for t in later.targets if isinstance(t, ast.Name)]
                    if any(any(w in n.lower() for w in _LOSS_NAMES) for n in names):
                        loss_line = later.lineno
                        break
                    flowing.update(names)
            if loss_line is not None:
                found.append((st.lineno, ast.unparse(st), qname, loss_line))
    return sorted(set(found))
