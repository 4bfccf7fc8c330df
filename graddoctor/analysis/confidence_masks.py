"""The script's pseudo-label confidence masks, read from its source: a mask that keeps the rows
whose top class probability is *below* a threshold and weighs or selects a loss with it."""

from __future__ import annotations

import ast

from .source import _parse, walk

_CASTS = frozenset({"float", "to", "type", "half", "double", "int", "long", "bool", "detach",
                    "unsqueeze", "squeeze", "view", "reshape", "cuda", "cpu"})
_PROBABILITY_CALLS = frozenset({"softmax", "sigmoid"})
# comparisons that keep the rows below the threshold, as methods and as operators
_KEEP_LOW_METHODS = {"lt": "ge", "le": "gt", "less": "greater_equal", "less_equal": "greater"}
_KEEP_LOW_FUNCTIONS = {"lt": "ge", "le": "gt", "less": "greater_equal", "less_equal": "greater"}
_FLIPPED_OPERATORS = {ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<"}
_LOSS_CALLS = frozenset({"cross_entropy", "nll_loss", "binary_cross_entropy",
                         "binary_cross_entropy_with_logits", "kl_div", "mse_loss", "l1_loss",
                         "smooth_l1_loss", "soft_cross_entropy", "ce_loss"})


def _strip_casts(expr: ast.AST) -> ast.AST:
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in _CASTS:
        expr = expr.func.value
    return expr


def _name(expr: ast.AST) -> str | None:
    expr = _strip_casts(expr)
    while isinstance(expr, ast.Subscript):
        expr = _strip_casts(expr.value)
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _called(expr: ast.AST) -> str | None:
    if isinstance(expr, ast.Call):
        f = expr.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            return f.id
    return None


def _makes_probabilities(expr: ast.AST, probabilities: set[str]) -> bool:
    """A softmax or sigmoid call in ``expr``, or a name the script assigned one to."""
    for node in walk(expr):
        if _called(node) in _PROBABILITY_CALLS:
            return True
        if isinstance(node, ast.Name) and node.id in probabilities:
            return True
    return False


def _max_over(expr: ast.AST) -> ast.AST | None:
    """The tensor of ``torch.max(p, dim)``, ``p.max(dim)`` (and ``amax``), through ``[0]`` and
    ``.values``; None for anything else."""
    expr = _strip_casts(expr)
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and expr.slice.value == 0:
        expr = expr.value
    if isinstance(expr, ast.Attribute) and expr.attr == "values":
        expr = expr.value
    if not isinstance(expr, ast.Call) or _called(expr) not in ("max", "amax"):
        return None
    f = expr.func
    if isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id in ("torch", "np", "numpy")):
        return f.value
    return expr.args[0] if expr.args else None


def _confidences(tree: ast.AST) -> set[str]:
    """Names assigned the largest class probability of each row."""
    probabilities = set()
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _makes_probabilities(node.value, set()):
            probabilities.add(node.targets[0].id)
    found = set()
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple) and target.elts:
            target = target.elts[0]
            over = _max_over(value) if _called(_strip_casts(value)) in ("max", "amax") else None
        else:
            over = _max_over(value)
        if over is not None and isinstance(target, ast.Name) and _makes_probabilities(over, probabilities):
            found.add(target.id)
    return found


def _keeps_low(expr: ast.AST, confidences: set[str]) -> tuple[str, str] | None:
    """The comparison written the other way round and the confidence compared when ``expr``
    keeps the rows whose confidence is below a threshold (``conf.lt(t)``, ``conf < t``,
    ``t > conf``), else None."""
    expr = _strip_casts(expr)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        left, right, op = expr.left, expr.comparators[0], type(expr.ops[0])
        if op in (ast.Lt, ast.LtE) and _name(left) in confidences:
            return f"{ast.unparse(left)} {_FLIPPED_OPERATORS[op]} {ast.unparse(right)}", _name(left)
        if op in (ast.Gt, ast.GtE) and _name(right) in confidences:
            return f"{ast.unparse(left)} {_FLIPPED_OPERATORS[op]} {ast.unparse(right)}", _name(right)
        return None
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        method = expr.func.attr
        owner = expr.func.value
        if method in _KEEP_LOW_METHODS and _name(owner) in confidences and expr.args:
            return f"{ast.unparse(owner)}.{_KEEP_LOW_METHODS[method]}({ast.unparse(expr.args[0])})", _name(owner)
        if method in _KEEP_LOW_FUNCTIONS and isinstance(owner, ast.Name) and owner.id == "torch" \
                and len(expr.args) == 2 and _name(expr.args[0]) in confidences:
            return (f"torch.{_KEEP_LOW_FUNCTIONS[method]}({ast.unparse(expr.args[0])}, "
                    f"{ast.unparse(expr.args[1])})", _name(expr.args[0]))
    return None


def _loss_names(tree: ast.AST) -> frozenset[str]:
    """Names the script assigns a loss to (``per_row = F.cross_entropy(..., reduction="none")``),
    followed through two assignments."""
    names: set[str] = set()
    for _ in range(2):
        for node in walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and _lossy(node.value, names):
                names.add(node.targets[0].id)
    return frozenset(names)


def _lossy(expr: ast.AST, losses=frozenset()) -> bool:
    """Whether ``expr`` computes or names a loss."""
    for node in walk(expr):
        if isinstance(node, ast.Name) and node.id in losses:
            return True
        if _called(node) in _LOSS_CALLS:
            return True
        if isinstance(node, ast.Name) and "loss" in node.id.lower():
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
                and any(w in (_called(node) or "").lower() for w in ("loss", "criterion")):
            return True
    return False


def _factors(node: ast.BinOp) -> list[ast.AST]:
    out = []
    for side in (node.left, node.right):
        if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult):
            out.extend(_factors(side))
        else:
            out.append(side)
    return out


def _complemented(tree: ast.AST, name: str) -> bool:
    """Whether the script turns the mask around before or while using it (``~mask``,
    ``1 - mask``, ``logical_not``, ``masked_fill(mask, ...)``, ``where(mask, 0, ...)``)."""
    for node in walk(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)) \
                and _name(node.operand) == name:
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _name(node.right) == name:
            return True
        called = _called(node)
        if called in ("logical_not", "masked_fill", "masked_fill_", "where") and any(
                _name(a) == name for a in node.args):
            return True
    return False


def _uses(tree: ast.AST, name: str | None, losses: frozenset[str], inline: ast.AST | None = None):
    """The first statement that weighs a loss by the mask (a product of the loss and the mask)
    or selects the loss's rows with it (``loss[mask]``, ``masked_select``): its line."""
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            factors = _factors(node)
            hit = [f for f in factors if (inline is not None and f is inline)
                   or (name is not None and _name(f) == name and isinstance(_strip_casts(f), (ast.Name, ast.Attribute)))]
            if hit and any(_lossy(f, losses) for f in factors if f not in hit):
                return node
        if isinstance(node, ast.Subscript) and _lossy(node.value, losses):
            index = node.slice
            if (inline is not None and index is inline) or (name is not None and _name(index) == name
                                                            and isinstance(_strip_casts(index), (ast.Name, ast.Attribute))):
                return node
        if _called(node) == "masked_select" and node.args and _lossy(node.func.value if isinstance(node.func, ast.Attribute) else node.args[0], losses):
            mask = node.args[0] if isinstance(node.func, ast.Attribute) else (node.args[1] if len(node.args) > 1 else None)
            if mask is not None and ((inline is not None and mask is inline) or _name(mask) == name):
                return node
    return None


def inverted_confidence_masks(path: str) -> list[tuple[int, str, str, str, int]]:
    """``(line, text, confidence, kept, use_line)`` of each pseudo-label mask that keeps the rows
    whose top class probability is below the threshold and weighs or selects a loss: ``line`` and
    ``text`` the comparison's statement (the mask's assignment, or the loss statement for a
    comparison written inline), ``confidence`` its compared name, ``kept`` the comparison written
    the other way round, ``use_line`` where the loss uses it. A mask the script complements
    anywhere (``~mask``, ``1 - mask``, ``masked_fill(mask, 0)``) is left out; [] when the file
    cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    confidences = _confidences(tree)
    if not confidences:
        return []
    losses = _loss_names(tree)
    found = []
    statements = [n for n in walk(tree) if isinstance(n, ast.stmt)]
    for node in statements:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            kept = _keeps_low(node.value, confidences)
            name = node.targets[0].id
            if kept and not _complemented(tree, name):
                use = _uses(tree, name, losses)
                if use is not None:
                    found.append((node.lineno, ast.unparse(node).strip(), kept[1], kept[0], use.lineno))
                    continue
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)) and node.value is not None:
            for sub in walk(node.value):
                kept = _keeps_low(sub, confidences) if isinstance(sub, (ast.Compare, ast.Call)) else None
                if not kept:
                    continue
                # the comparison's own node, or the cast around it, used inline on a loss
                for wrapper in walk(node.value):
                    if _strip_casts(wrapper) is sub and _uses(node, None, losses, inline=wrapper) is not None:
                        found.append((node.lineno, ast.unparse(node).strip(), kept[1], kept[0], node.lineno))
                        break
    return sorted(set(found))
