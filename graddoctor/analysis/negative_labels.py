"""Binary losses whose positive scores are labelled 0 and negative scores 1, read from the
script's source: link prediction, BPR-style implicit feedback and knowledge-graph triples score
true pairs (``pos``) against sampled ones (``neg``) and train a binary cross-entropy on them.

Two forms are read, in each function (and the module's top level):
- a loss call whose input is a ``torch.cat`` of score blocks and whose target is a ``torch.cat``
  of constant blocks (``ones``/``zeros``, their ``_like`` and ``new_`` forms, ``full(.., 1)``), each
  named through at most one assignment: every score block named as positive
  (``pos``/``positive``) labelled 0 and every one named as negative (``neg``/``negative``/
  ``corrupt``) labelled 1, both roles present;
- a loss call on one score block named as positive with a constant 0 target, or as negative with
  a constant 1 target.

A block whose names say both roles, or neither, reads as nothing; a block order mixing right and
wrong pairs reads as nothing too (it is no swap). Names of the discriminator's kind (``real``,
``fake``) are left out: a GAN's generator labels its fakes 1 on purpose.
"""

from __future__ import annotations

import ast
import re

from .source import _parse, walk

_BINARY_LOSSES = frozenset({"binary_cross_entropy_with_logits", "binary_cross_entropy",
                            "soft_margin_loss"})
_BINARY_CRITERIA = frozenset({"BCEWithLogitsLoss", "BCELoss"})
_CASTS = frozenset({"float", "to", "type", "double", "half", "long", "int", "bool", "detach",
                    "view", "reshape", "flatten", "squeeze", "unsqueeze", "view_as", "cuda", "cpu"})
_ONES = frozenset({"ones", "ones_like", "new_ones"})
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})
_FULL = frozenset({"full", "full_like", "new_full"})
_POSITIVE = re.compile(r"^(pos|positive|positives)$", re.I)
_NEGATIVE = re.compile(r"^(neg|negs|negative|negatives|corrupt|corrupted|corruption)$", re.I)


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            return f.id
    return None


def _strip(expr: ast.AST) -> ast.AST:
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _CASTS:
        expr = expr.func.value
    return expr


def _tokens(expr: ast.AST) -> set[str]:
    """The underscore-separated words of every name and attribute in ``expr`` (``train_pos`` gives
    ``train`` and ``pos``); single letters only from a whole name (``p``, ``n`` are roles only
    spelled out as ``pos_p`` or alone would be too weak, so they are not read)."""
    words = set()
    for node in walk(expr):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is None:
            continue
        for word in re.split(r"_+|(?<=[a-z])(?=[A-Z])", name):
            if len(word) > 1:
                words.add(word.lower())
    return words


def _role(expr: ast.AST) -> str | None:
    words = _tokens(expr)
    positive = any(_POSITIVE.match(w) for w in words)
    negative = any(_NEGATIVE.match(w) for w in words)
    if positive == negative:
        return None
    return "positive" if positive else "negative"


def _constant(expr: ast.AST) -> int | None:
    """1 or 0 when ``expr`` makes a tensor of that one value (``torch.ones(n)``,
    ``zeros_like(s)``, ``s.new_full(shape, 1.0)``), else None."""
    expr = _strip(expr)
    called = _called(expr)
    if called in _ONES:
        return 1
    if called in _ZEROS:
        return 0
    if called in _FULL:
        value = expr.args[-1] if len(expr.args) >= 2 else next(
            (k.value for k in expr.keywords if k.arg == "fill_value"), None)
        if isinstance(value, ast.Constant) and value.value in (0, 1) and not isinstance(value.value, bool):
            return int(value.value)
    return None


def _blocks(expr: ast.AST) -> list[ast.AST] | None:
    """The blocks of ``torch.cat([a, b, ...])`` (or ``torch.concat``/``hstack``), else None."""
    expr = _strip(expr)
    if _called(expr) not in ("cat", "concat", "concatenate", "hstack") or not expr.args:
        return None
    first = expr.args[0]
    if isinstance(first, (ast.List, ast.Tuple)) and len(first.elts) >= 2 \
            and not any(isinstance(e, ast.Starred) for e in first.elts):
        return list(first.elts)
    return None


def _criteria(tree: ast.AST) -> set[str]:
    """Names and attributes the script binds a binary loss module to (``crit = nn.BCEWithLogitsLoss()``)."""
    names = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign) and _called(node.value) in _BINARY_CRITERIA:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return names


def _assignments(scope: ast.AST) -> dict[str, list[ast.Assign]]:
    found: dict[str, list[ast.Assign]] = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append(node)
    return found


def _resolve(expr: ast.AST, assigned: dict[str, list[ast.Assign]], before: int) -> tuple[ast.AST, int | None]:
    """``expr``, or the value of the latest assignment to the name it is made before ``before``,
    with that assignment's line (None for ``expr`` itself)."""
    bare = _strip(expr)
    if isinstance(bare, ast.Name):
        earlier = [a for a in assigned.get(bare.id, ()) if a.lineno <= before]
        if earlier:
            latest = max(earlier, key=lambda a: a.lineno)
            return latest.value, latest.lineno
    return expr, None


def _loss_arguments(call: ast.Call) -> tuple[ast.AST, ast.AST] | None:
    keywords = {k.arg: k.value for k in call.keywords}
    args = list(call.args)
    scores = args[0] if args else keywords.get("input")
    target = args[1] if len(args) > 1 else keywords.get("target")
    if scores is None or target is None:
        return None
    return scores, target


def _statement_line(scope: ast.AST, call: ast.Call) -> int:
    """The first line of the innermost statement of ``scope`` that holds ``call`` (the calls
    of one multi-line sum are told once)."""
    best = None
    for node in walk(scope):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                                 ast.For, ast.While, ast.If, ast.With, ast.Try)) \
                and node.lineno <= call.lineno <= (node.end_lineno or node.lineno):
            if best is None or node.lineno > best.lineno:
                best = node
    return best.lineno if best is not None else call.lineno


def negatives_labelled_positive(path: str) -> list[tuple[int, str, str, str]]:
    """``(line, text, scores, labels)`` of each binary loss whose positives are labelled 0 and
    negatives 1: ``line``/``text`` the statement that makes the labels (the loss call for a lone
    constant target), ``scores`` and ``labels`` the two blocks' order as written."""
    tree = _parse(path)
    if tree is None:
        return []
    criteria = _criteria(tree)
    found, told = [], set()
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
    for scope in scopes:
        assigned = _assignments(scope)
        for node in walk(scope):
            if not isinstance(node, ast.Call):
                continue
            called = _called(node)
            if called not in _BINARY_LOSSES and not (called in criteria and isinstance(node.func, (ast.Name, ast.Attribute))):
                continue
            pair = _loss_arguments(node)
            if pair is None:
                continue
            scores, scores_line = _resolve(pair[0], assigned, node.lineno)
            target, target_line = _resolve(pair[1], assigned, node.lineno)
            score_blocks, label_blocks = _blocks(scores), _blocks(target)
            if score_blocks is not None and label_blocks is not None:
                if len(score_blocks) != len(label_blocks):
                    continue
                roles = [_role(b) for b in score_blocks]
                values = [_constant(b) for b in label_blocks]
                if None in roles or None in values or len(set(roles)) < 2:
                    continue
                if all((r == "positive") == (v == 0) for r, v in zip(roles, values)):
                    if target_line is None:
                        target_line = _statement_line(scope, node)
                    key = (target_line, scores_line)
                    if key not in told:
                        told.add(key)
                        found.append((target_line, ast.unparse(target),
                                      ", ".join(roles), ", ".join(str(v) for v in values)))
                continue
            if score_blocks is None and label_blocks is None:
                role, value = _role(scores), _constant(target)
                if role is None or value is None or (role == "positive") != (value == 0):
                    continue
                line = _statement_line(scope, node)
                if (line, 0) not in told:
                    told.add((line, 0))
                    found.append((line, ast.unparse(node), role, str(value)))
    return sorted(found)


def _flipped(expr: ast.AST) -> bool:
    """``-x``, ``x.neg()``, ``-1 * x``, ``1 - x``: a score given with its sign (or its
    probability's complement) flipped, which makes a 1 target right for a negative."""
    expr = _strip(expr)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Sub) and isinstance(expr.left, ast.Constant):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return any(isinstance(side, ast.UnaryOp) and isinstance(side.op, ast.USub) for side in (expr.left, expr.right))
    return _called(expr) in ("neg", "negative")


def paired_labels_wrong(path: str) -> list[tuple[int, str, str, int]]:
    """``(line, text, role, label)`` of each binary loss call, in a function (or the module's top
    level) that gives both a positive-named and a negative-named score block its own binary loss
    with a constant target, that labels a negative 1 or a positive 0. Scores given with their
    sign flipped (``-neg``, ``1 - p_neg``) read as nothing: a 1 target is right for them."""
    tree = _parse(path)
    if tree is None:
        return []
    criteria = _criteria(tree)
    found, seen_calls = [], set()
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
    for scope in scopes:
        assigned = _assignments(scope)
        calls = []
        for node in walk(scope):
            if not isinstance(node, ast.Call) or id(node) in seen_calls:
                continue
            called = _called(node)
            if called not in _BINARY_LOSSES and not (called in criteria and isinstance(node.func, (ast.Name, ast.Attribute))):
                continue
            seen_calls.add(id(node))
            pair = _loss_arguments(node)
            if pair is None:
                continue
            scores, _ = _resolve(pair[0], assigned, node.lineno)
            target, _ = _resolve(pair[1], assigned, node.lineno)
            if _blocks(scores) is not None or _blocks(target) is not None:
                continue
            role, value = _role(pair[0]) or _role(scores), _constant(target)
            if role is None or value is None or _flipped(pair[0]) or _flipped(scores):
                continue
            calls.append((node, role, value))
        if len({role for _, role, _ in calls}) < 2:
            continue
        for node, role, value in calls:
            if (role == "positive") == (value == 0):
                found.append((node.lineno, ast.unparse(node), role, value))
    return sorted(set(found))
