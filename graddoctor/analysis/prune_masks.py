"""The script's magnitude-pruning masks, read from its source: a mask that keeps the weights whose
magnitude is *below* a pruning threshold (the smallest ones) and multiplies the weights with it,
or an in-place write that zeroes the weights *above* it.

A pruning threshold is a name the script assigns from an order statistic of magnitudes: a
``kthvalue``/``quantile``/``topk``/``sort``/``percentile``/``median`` call in an expression that
takes an absolute value (``w.abs().flatten().kthvalue(k).values``, ``torch.quantile(w.abs(), s)``,
``np.percentile(np.abs(w), 50)``), or a name assigned from such a name (``thr = sorted_w[k]``)."""

from __future__ import annotations

import ast

from .source import _parse, walk

_CASTS = frozenset({"float", "to", "type", "type_as", "half", "double", "int", "long", "bool",
                    "detach", "view", "reshape", "view_as", "cuda", "cpu", "clone"})
_ORDER_CALLS = frozenset({"kthvalue", "quantile", "nanquantile", "topk", "sort", "percentile",
                          "median", "nanpercentile", "msort"})
_KEEP_LOW_CALLS = {"lt": "gt", "le": "ge", "less": "greater", "less_equal": "greater_equal"}
_KEEP_HIGH_CALLS = {"gt": "lt", "ge": "le", "greater": "less", "greater_equal": "less_equal"}
_KEEP_LOW_OPS = {ast.Lt: ">", ast.LtE: ">="}
_KEEP_HIGH_OPS = {ast.Gt: "<", ast.GtE: "<="}


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _strip_casts(expr: ast.AST) -> ast.AST:
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in _CASTS:
        expr = expr.func.value
    return expr


def _takes_abs(expr: ast.AST) -> bool:
    return any(_called(n) in ("abs", "absolute") for n in walk(expr))


def _names(expr: ast.AST) -> set[str]:
    return {n.id for n in walk(expr) if isinstance(n, ast.Name)}


def _thresholds(tree: ast.AST) -> set[str]:
    """Names assigned an order statistic of magnitudes, or assigned from such a name."""
    found: set[str] = set()
    assigns = [n for n in walk(tree) if isinstance(n, ast.Assign)]
    magnitudes = {t.id for node in assigns if _takes_abs(node.value)
                  for t in node.targets if isinstance(t, ast.Name)}  # all_mags = w.abs().flatten()
    for node in assigns:
        if any(_called(n) in _ORDER_CALLS for n in walk(node.value)) and (
                _takes_abs(node.value) or _names(node.value) & magnitudes):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    if not found:
        return found
    for node in assigns:  # one hop: thr = sorted_mags[k]
        if _names(node.value) & found:
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def _magnitude_comparison(expr: ast.AST, thresholds: set[str]) -> tuple[str, str] | None:
    """("low" | "high", the comparison written the other way) for a comparison of magnitudes
    (a side taking ``abs``) with a pruning threshold (the other side naming one)."""
    expr = _strip_casts(expr)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        left, right, op = expr.left, expr.comparators[0], type(expr.ops[0])
        if _takes_abs(left) and _names(right) & thresholds and not _takes_abs(right):
            kind = "low" if op in _KEEP_LOW_OPS else "high" if op in _KEEP_HIGH_OPS else None
            other = _KEEP_LOW_OPS.get(op) or _KEEP_HIGH_OPS.get(op)
        elif _takes_abs(right) and _names(left) & thresholds and not _takes_abs(left):
            # T > |w| keeps the small ones
            kind = "low" if op in _KEEP_HIGH_OPS else "high" if op in _KEEP_LOW_OPS else None
            other = _KEEP_LOW_OPS.get(op) or _KEEP_HIGH_OPS.get(op)
        else:
            return None
        if kind is None:
            return None
        flipped = ast.Compare(left=left, ops=[{">": ast.Gt(), ">=": ast.GtE(), "<": ast.Lt(),
                                               "<=": ast.LtE()}[other]], comparators=[right])
        return kind, ast.unparse(flipped)
    called = _called(expr)
    if called not in _KEEP_LOW_CALLS and called not in _KEEP_HIGH_CALLS:
        return None
    if not isinstance(expr.func, ast.Attribute):
        return None
    value, args = expr.func.value, list(expr.args)
    if isinstance(value, ast.Name) and value.id in ("torch", "np", "numpy"):
        if len(args) != 2:
            return None
        value, args = args[0], args[1:]
    if not args or not _takes_abs(value) or not (_names(args[0]) & thresholds):
        return None
    kind = "low" if called in _KEEP_LOW_CALLS else "high"
    other = _KEEP_LOW_CALLS.get(called) or _KEEP_HIGH_CALLS.get(called)
    return kind, f"{ast.unparse(value)}.{other}({ast.unparse(args[0])})"


def _base(expr: ast.AST) -> str | None:
    """The name a mask is held by: ``mask``, ``masks`` of ``masks[name]``, ``self.mask``'s ``mask``."""
    expr = _strip_casts(expr)
    while isinstance(expr, ast.Subscript):
        expr = _strip_casts(expr.value)
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _held_by(tree: ast.AST, name: str) -> set[str]:
    """``name`` and the loop variables that take its items (``for w, k in zip(weights, keep)``,
    ``for k in keep``): a list or dict of masks is applied one mask at a time."""
    names = {name}
    for node in walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and name in _names(node.iter):
            names |= _names(node.target)
    return names


def _multiplies(tree: ast.AST, name: str) -> int | None:
    """The line of the first statement that multiplies something by the mask held by ``name``
    (``p.mul_(masks[n])``, ``w.data *= mask``, ``w * mask``, ``torch.mul(w, mask)``)."""
    held = _held_by(tree, name)
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
                and held & {_base(node.left), _base(node.right)}:
            return node.lineno
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) and _base(node.value) in held:
            return node.lineno
        if _called(node) in ("mul_", "mul", "multiply", "multiply_") and any(
                _base(a) in held for a in node.args):
            return node.lineno
    return None


def _element(expr: ast.AST) -> ast.AST:
    """The mask a comprehension builds for each weight (``[(w.abs() < t).float() for w in ws]``)."""
    if isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return expr.elt
    if isinstance(expr, ast.DictComp):
        return expr.value
    return expr


def _complemented(tree: ast.AST, name: str) -> bool:
    """The script also uses the mask turned around (``~mask``, ``1 - mask``, ``logical_not``):
    both parts are kept (an outlier split), not one pruned away."""
    for node in walk(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)) \
                and _base(node.operand) == name:
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _base(node.right) == name:
            return True
        if _called(node) in ("logical_not", "logical_not_", "masked_fill", "masked_fill_") and any(
                _base(a) == name for a in node.args):
            return True
    return False


def _zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, 0.0) and not isinstance(node.value, bool)


def inverted_prune_masks(path: str) -> list[tuple[int, str, str, int]]:
    """``(line, text, kept, use_line)`` of each magnitude-pruning mask that keeps the weights below
    the threshold and multiplies weights (``kept``: the comparison the other way round), and of
    each in-place write of zeros to the weights above it (``w[w.abs() > thr] = 0``,
    ``masked_fill_(w.abs() >= thr, 0)``; ``use_line`` is its own line). A mask the script also
    uses complemented, or whose opposite comparison multiplies weights too (an outlier split
    that keeps both parts), is left out; [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    thresholds = _thresholds(tree)
    if not thresholds:
        return []
    found = []
    sides: dict = {}  # the threshold's names -> the kinds compared with it, to tell an outlier split
    for node in walk(tree):
        got = _magnitude_comparison(node, thresholds) if isinstance(node, (ast.Compare, ast.Call)) else None
        if got is not None:
            sides.setdefault(frozenset(_names(node) & thresholds), set()).add(got[0])
    split = {names for names, kinds in sides.items() if len(kinds) == 2}
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            got = _magnitude_comparison(_element(node.value), thresholds)
            if got is not None and frozenset(_names(node.value) & thresholds) in split:
                continue  # both sides of one threshold used: an outlier split
            if got is not None and got[0] == "low":
                name = _base(node.targets[0])
                if name is not None and not _complemented(tree, name):
                    use = _multiplies(tree, name)
                    if use is not None:
                        found.append((node.lineno, ast.unparse(node).strip(), got[1], use))
                continue
            # w[w.abs() > thr] = 0: the largest weights zeroed in place
            target = node.targets[0]
            if isinstance(target, ast.Subscript) and _zero(node.value):
                got = _magnitude_comparison(target.slice, thresholds)
                if got is not None and got[0] == "high":
                    found.append((node.lineno, ast.unparse(node).strip(), got[1], node.lineno))
        elif isinstance(node, ast.Expr) and _called(node.value) in ("masked_fill_", "masked_fill") \
                and len(node.value.args) == 2 and _zero(node.value.args[1]):
            got = _magnitude_comparison(node.value.args[0], thresholds)
            if got is not None and got[0] == "high":
                found.append((node.lineno, ast.unparse(node).strip(), got[1], node.lineno))
    return found
