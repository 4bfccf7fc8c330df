"""Two-view self-supervised losses that compare each view's prediction with its own view's
stop-gradient target, read from the script's source: ``D(p1, z1) + D(p2, z2)`` where SimSiam and
BYOL write ``D(p1, z2) + D(p2, z1)``."""

from __future__ import annotations

import ast
import re

from .source import _enclosing_function, _parse, _returned_values, walk

_TAG = re.compile(r"^(.*?[A-Za-z])_?(1|2|one|two)$")
_WORDS = {"one": "1", "two": "2"}
_CASTS = frozenset({"detach", "float", "clone", "contiguous", "to", "flatten", "squeeze", "unsqueeze"})


def _base(expr: ast.AST) -> tuple[ast.AST, bool]:
    """``expr`` past casts and ``.detach()``, and whether a ``.detach()`` was among them."""
    detached = False
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _CASTS:
        detached = detached or expr.func.attr == "detach"
        expr = expr.func.value
    return expr, detached


def _tag(expr: ast.AST) -> tuple[str, str] | None:
    """``(stem, view)`` of a name ending in a view number (``p1``, ``z_2``, ``target_proj_two``)."""
    expr, _ = _base(expr)
    name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else None
    if name is None:
        return None
    m = _TAG.match(name)
    if m is None:
        return None
    return m.group(1).rstrip("_"), _WORDS.get(m.group(2), m.group(2))


def _no_grad_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in walk(tree):
        if isinstance(node, ast.With) and any(
                "no_grad" in ast.unparse(item.context_expr) or "inference_mode" in ast.unparse(item.context_expr)
                for item in node.items):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _detaching_function(tree: ast.AST, call: ast.Call) -> bool:
    """Whether the function called is a ``def`` of the file that detaches its second parameter
    (``def D(p, z): z = z.detach()``: SimSiam's paper code)."""
    name = call.func.id if isinstance(call.func, ast.Name) else None
    defs = [d for d in walk(tree) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name]
    if len(defs) != 1 or len(defs[0].args.args) < 2:
        return False
    target = defs[0].args.args[1].arg
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "detach"
               and isinstance(n.func.value, ast.Name) and n.func.value.id == target for n in walk(defs[0]))


def _stop_gradient(tree: ast.AST, call: ast.Call, line: int, quiet: set[int]) -> bool:
    """Whether the target ``expr`` (on ``line``) carries no gradient by the script's text: a
    ``.detach()`` on it, a name assigned under ``torch.no_grad()``, or a name a function of the
    file returns detached (SimSiam's ``return p1, p2, z1.detach(), z2.detach()``), or a call of
    a function that detaches its second parameter."""
    expr = call.args[1]
    base, detached = _base(expr)
    if detached or _detaching_function(tree, call):
        return True
    if not isinstance(base, ast.Name):
        return False
    scope = _enclosing_function(tree, line)
    for node in walk(scope):
        if isinstance(node, ast.Assign) and node.lineno <= line and any(
                isinstance(t, ast.Name) and t.id == base.id or isinstance(t, ast.Tuple) and any(
                    isinstance(e, ast.Name) and e.id == base.id for e in t.elts) for t in node.targets):
            if node.lineno in quiet:
                return True
            if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute) \
                    and node.value.func.attr == "detach":
                return True
    returned = _returned_values(tree, scope, base.id)
    return bool(returned) and all(_base(value)[1] for _, value in returned)


def _assigned(scope: ast.AST, name: str, line: int) -> ast.AST | None:
    """The value the latest assignment before ``line`` in ``scope`` gives ``name`` (an element
    of a tuple assigned a tuple of the same length), else None."""
    best = None
    for node in walk(scope):
        if not isinstance(node, ast.Assign) or node.lineno > line or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and target.id == name:
            found = value
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                and len(target.elts) == len(value.elts):
            found = next((v for t, v in zip(target.elts, value.elts)
                          if isinstance(t, ast.Name) and t.id == name), None)
        elif isinstance(target, ast.Tuple) and any(isinstance(t, ast.Name) and t.id == name
                                                   for t in target.elts):
            found = value  # ``p1, p2, z1, z2 = model(x1, x2)``: the call makes them all
        else:
            continue
        if found is not None and (best is None or node.lineno >= best[0]):
            best = (node.lineno, found)
    return best[1] if best is not None else None


def _network_input(expr: ast.AST, scope: ast.AST, line: int) -> str | None:
    """The text of what the networks that make ``expr`` read first: calls are followed into
    their first argument, names into the call they are assigned (``p1 = predictor(z1)``, ``z1 =
    encoder(x1)``: ``x1``); None when no call makes it."""
    text = None
    for _ in range(8):
        base, _ = _base(expr)
        if isinstance(base, ast.Call) and base.args:
            expr = base.args[0]
            text = ast.unparse(expr)
            continue
        if not isinstance(base, ast.Name):
            return text
        value = _assigned(scope, base.id, line)
        if value is None or not isinstance(_base(value)[0], ast.Call):
            return text
        expr = value
    return text


def _own_view_on_purpose(tree: ast.AST, call: ast.Call, line: int) -> bool:
    """Whether a view's prediction reads another input than its target: the student given a
    masked or corrupted copy of the view (``student(x1 * m1)``) and the teacher the view itself
    (``teacher(x1)``), as masked prediction (data2vec, I-JEPA) pairs each view with its own."""
    scope = _enclosing_function(tree, line)
    seen = _network_input(call.args[0], scope, line)
    target = _network_input(call.args[1], scope, line)
    return seen is not None and target is not None and seen != target


def views_paired_with_themselves(path: str) -> list[tuple[int, str, str]]:
    """``(line, text, crossed)`` of each statement that sums two calls of one comparison, each
    given a prediction and a stop-gradient target of the same view (``D(p1, z1) + D(p2, z2)``:
    names ending in 1/2 or one/two), the two calls of two different views; ``crossed`` is the
    statement with the targets swapped. A prediction made from another input than its target
    (the student given a masked copy of the view, the teacher the view) is masked prediction,
    which pairs each view with itself: left out. [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    quiet = _no_grad_lines(tree)
    found = []
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.Return)) or node.value is None:
            continue
        calls: dict[str, list[ast.Call]] = {}
        for sub in walk(node.value):
            if isinstance(sub, ast.Call) and len(sub.args) >= 2 and not (
                    isinstance(sub.func, ast.Attribute) and sub.func.attr in _CASTS):
                calls.setdefault(ast.unparse(sub.func), []).append(sub)
        for group in calls.values():
            if len(group) != 2:
                continue
            tags = [(_tag(c.args[0]), _tag(c.args[1])) for c in group]
            if any(a is None or b is None or a[0] == b[0] for a, b in tags):
                continue
            if not all(a[1] == b[1] for a, b in tags) or tags[0][0][1] == tags[1][0][1]:
                continue
            if not all(_stop_gradient(tree, c, node.lineno, quiet) for c in group):
                continue
            if all(_own_view_on_purpose(tree, c, node.lineno) for c in group):
                continue  # each view's masked copy predicts the view: masked prediction
            text = ast.unparse(node)
            first, second = group
            swapped = []
            for call, other in ((first, second), (second, first)):
                twin = ast.Call(func=call.func, args=[call.args[0], other.args[1], *call.args[2:]],
                                keywords=call.keywords)
                swapped.append((ast.unparse(call), ast.unparse(twin)))
            crossed = text
            for old, new in swapped:
                crossed = crossed.replace(old, "\0" + new + "\0", 1)
            found.append((node.lineno, text.strip(), crossed.replace("\0", "").strip()))
    return sorted(set(found))
