"""Importance ratios written upside down, read from the script's source: a ratio or rho
(``ratio``, ``log_rhos``, ``is_ratio``) assigned the behaviour policy's log-probability minus the
current one's (``exp(old_logp - logp)``), or its probability divided by the current one's, where
importance sampling weighs by the current policy over the behaviour policy."""

from __future__ import annotations

import ast
import re

from .source import _parse, walk

_RATIO_NAME = re.compile(r"(^|_)(log_?)?(ratio|ratios|rho|rhos|is_ratio|is_ratios|importance_ratio|importance_weights?|is_weights?|iw)$")
_BEHAVIOUR = frozenset({"old", "behaviour", "behavior", "behav", "beh", "mu", "rollout", "sampled",
                        "sampling", "actor", "prev", "buffer", "stale"})
# names of the other side are the policy being trained; references of a KL penalty are no policy
# that sampled the data
_OTHER = frozenset({"ref", "reference", "prior", "teacher", "expert", "demo"})
# truncations of the ratio (V-trace's rho-bar, Retrace's c) read through to the ratio itself
_BOUNDS = ("clamp", "clamp_max", "clip", "minimum", "min", "detach")
_MODULES = frozenset({"torch", "np", "numpy", "F", "math", "jnp"})
_POLICY = re.compile(r"(logp|log_?probs?|logprobs?|probs?|pi|likelihood|log_?pi|lp|logits?)")


def _name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
            node = node.func.value  # .detach(), .float(), .squeeze()
        elif isinstance(node, ast.Name):
            return node.id
        elif isinstance(node, ast.Attribute):
            return node.attr if not isinstance(node.value, ast.Name) or node.value.id in ("self", "batch", "b", "data") \
                else f"{node.value.id}_{node.attr}"
        else:
            return None


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"_|(?<=[a-z])(?=[A-Z])|\d", name.lower()) if w}


def _behaviour(name: str) -> bool:
    w = _words(name)
    return bool(w & _BEHAVIOUR) and not (w & _OTHER) and bool(_POLICY.search(name.lower()))


def _current(name: str) -> bool:
    w = _words(name)
    return not (w & _BEHAVIOUR) and not (w & _OTHER) and bool(_POLICY.search(name.lower()))


def _inverted(expr: ast.AST) -> tuple[str, str] | None:
    """(behaviour, current) names of ``behaviour - current`` or ``behaviour / current``, through
    ``exp``/``.exp()``."""
    if isinstance(expr, ast.Call):
        f = expr.func
        module = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in _MODULES
        if isinstance(f, ast.Attribute) and not module and (f.attr == "exp" and not expr.args or f.attr in _BOUNDS):
            return _inverted(f.value)
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in ("exp", *_BOUNDS) and expr.args:
            return _inverted(expr.args[0])
        return None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Sub, ast.Div)):
        left, right = _name(expr.left), _name(expr.right)
        if left and right and _current(right) and (
                _behaviour(left) or ("new" in right.lower() and "new" not in left.lower()
                                     and not (_words(left) & _OTHER) and bool(_POLICY.search(left.lower())))):
            return left, right
    return None


def inverted_importance_ratios(path: str) -> list[tuple[int, str, str, str, str]]:
    """``(line, the statement's text, the ratio's name, behaviour, current)`` for each
    assignment of a ratio-named value from the behaviour policy over the current one."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = _name(node.targets[0])
        if not target or not _RATIO_NAME.search(target.lower()):
            continue
        pair = _inverted(node.value)
        if pair:
            found.append((node.lineno, ast.unparse(node), target, pair[0], pair[1]))
    return sorted(set(found))
