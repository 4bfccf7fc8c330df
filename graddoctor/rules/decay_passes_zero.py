from __future__ import annotations

import ast
import operator

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}
_CLAMPS = frozenset({"max", "min", "clamp", "clip", "maximum", "minimum", "clamp_min"})
_DEPTH = 6  # names followed through their assignments, at most


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles every parsed node
        return ""


def _constants(tree: ast.AST) -> dict[str, ast.AST]:
    """Names the file assigns exactly once (a plain ``name = value``), with their value."""
    seen: dict[str, list[ast.AST]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            seen.setdefault(node.target.id, []).extend([node.value, node.value])
        elif isinstance(node, (ast.For, ast.comprehension)):
            for n in walk(node.target):
                if isinstance(n, ast.Name):
                    seen.setdefault(n.id, []).extend([n, n])
    return {name: values[0] for name, values in seen.items() if len(values) == 1}


def _value(node: ast.AST, table: dict, depth: int = 0):
    """The number an expression of literals and once-assigned names spells, else None."""
    if depth > _DEPTH:
        return None
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in table:
        return _value(table[node.id], table, depth + 1)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left, table, depth + 1), _value(node.right, table, depth + 1)
        if left is None or right is None:
            return None
        try:
            return _OPS[type(node.op)](left, right)
        except ZeroDivisionError:
            return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float") \
            and len(node.args) == 1:
        return _value(node.args[0], table, depth + 1)
    return None


def _factors(node: ast.AST, table: dict, depth: int = 0) -> set[str]:
    """The texts of the factors of a product, names followed through their one assignment
    (``total = steps_per_epoch * EPOCHS`` gives ``{"steps_per_epoch", "EPOCHS"}``)."""
    if depth <= _DEPTH and isinstance(node, ast.Name) and node.id in table:
        inner = _factors(table[node.id], table, depth + 1)
        if len(inner) > 1:
            return inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left, table, depth + 1) | _factors(node.right, table, depth + 1)
    return {_text(node)}


def _is_counter(node: ast.AST, counter: str) -> bool:
    """``step``, ``step + 1``, ``float(step)``: the loop's counter as it is."""
    if isinstance(node, ast.Name):
        return node.id == counter
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) \
            and isinstance(node.right, ast.Constant) and type(node.right.value) is int:
        return _is_counter(node.left, counter)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" \
            and len(node.args) == 1:
        return _is_counter(node.args[0], counter)
    return False


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 1


def _decay(node: ast.AST, counter: str) -> ast.AST | None:
    """The length of a linear decay of the counter (``1 - step / N``, ``(N - step) / N``, ``a * (N - step) / N``):
    ``N``; None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_one(node.left) \
            and isinstance(node.right, ast.BinOp) and isinstance(node.right.op, ast.Div) \
            and _is_counter(node.right.left, counter):
        return node.right.right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        for factor in _product_factors(node.left):  # (N - step) / N, 2.0 * (N - step) / N
            if isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Sub) \
                    and _is_counter(factor.right, counter) and _text(factor.left) == _text(node.right):
                return node.right
    return None


def _product_factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _product_factors(node.left) + _product_factors(node.right)
    return [node]


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _own_statements(body: list[ast.stmt]):
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _own_statements(inner)


def _clamped_within(stmt: ast.stmt, target: ast.AST) -> bool:
    """Whether ``target`` sits inside a clamp (``max(0.0, ...)``, ``.clamp(min=0)``) in ``stmt``,
    or the statement is a test (``if 1 - step / N > 0:``)."""
    if isinstance(stmt, (ast.If, ast.While, ast.Assert)):
        return True
    for node in walk(stmt):
        if isinstance(node, ast.Call) and _callee(node) in _CLAMPS \
                and any(n is target for n in walk(node)):
            return True
    return False


def _clamped_later(statements: list[ast.stmt], after: int, names: set[str]) -> bool:
    for stmt in statements:
        if stmt.lineno <= after:
            continue
        for node in walk(stmt):
            if isinstance(node, ast.Call) and _callee(node) in _CLAMPS and any(
                    isinstance(n, ast.Name) and n.id in names for a in node.args for n in walk(a)):
                return True
    return False


def decays_past_zero(tree: ast.AST) -> list[dict]:
    """Each linear decay of a ``for`` loop's counter (``1 - step / N``, ``(N - step) / N``),
    neither clamped nor tested, whose ``N`` the loop's ``range`` runs past: its last value of
    the counter is larger than ``N`` as the file's literals say, or its stop is a product that
    holds ``N`` as one factor of two or more (``steps_per_epoch * EPOCHS``), or ``N`` counts
    epochs while the counter and the stop do not."""
    table = _constants(tree)
    found, seen = [], set()
    for loop in walk(tree):
        if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
                and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Name)
                and loop.iter.func.id in ("range", "trange") and 1 <= len(loop.iter.args) <= 3):
            continue
        counter = loop.target.id
        stop = loop.iter.args[0] if len(loop.iter.args) == 1 else loop.iter.args[1]
        statements = list(_own_statements(loop.body))
        for stmt in statements:
            for node in walk(stmt):
                length = _decay(node, counter)
                if length is None or id(node) in seen:
                    continue
                if _clamped_within(stmt, node):
                    continue
                names = {t.id for t in getattr(stmt, "targets", ()) if isinstance(t, ast.Name)}
                if names and _clamped_later(statements, stmt.lineno, names):
                    continue
                last, size = _value(stop, table), _value(length, table)
                why = None
                if last is not None and size is not None:
                    if last - 1 > size > 0:
                        why = ("values", last, size)
                    else:
                        continue
                elif _text(length) in _factors(stop, table) and len(_factors(stop, table)) > 1:
                    why = ("factor", None, None)
                elif "epoch" in _text(length).lower() and "epoch" not in counter.lower() \
                        and "epoch" not in _text(stop).lower():
                    why = ("unit", None, None)
                if why is None:
                    continue
                seen.add(id(node))
                found.append({"line": stmt.lineno, "text": _text(node), "counter": counter,
                              "length": _text(length), "stop": _text(stop), "why": why[0],
                              "last": why[1], "size": why[2], "loop": loop.lineno})
    return sorted(found, key=lambda h: h["line"])


class DecayPassesZero(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a linear decay of a
    `for` loop's counter (`1 - step / N`, `(N - step) / N`), neither clamped (`max(0.0, ...)`)
    nor tested, whose length `N` the loop runs past: the file's literals give the loop's last
    counter above `N`, or the loop's `range` stops at a product holding `N` as one of its
    factors (`range(steps_per_epoch * EPOCHS)` against `1 - step / EPOCHS`), or `N` counts
    epochs while the loop counts steps. It points at the decay.

    ## Why is this bad?
    A decay meant to bring a loss weight, a learning rate or a ratio down to 0 at the end of
    training is sized in the wrong unit or for a shorter run: it reaches 0 early and then goes
    on, negative, for the rest of the loop. A negative weight turns its loss term around (the
    auxiliary or consistency loss is maximised, and grows without bound), a negative learning
    rate climbs the loss. Nothing raises: the loss printed may even keep going down.

    ## Example
    ```python
    for step in range(steps_per_epoch * EPOCHS):
        aux_w = 0.5 * (1 - step / EPOCHS)
        loss = main_loss + aux_w * aux_loss
    ```

    ## Use instead
    ```python
    for step in range(steps_per_epoch * EPOCHS):
        aux_w = 0.5 * (1 - step / (steps_per_epoch * EPOCHS))
        loss = main_loss + aux_w * aux_loss
    ```

    ## Stays silent on
    A decay over the loop's own length (`for epoch in range(EPOCHS): 1 - epoch / EPOCHS`); a
    clamped one (`max(0.0, 1 - step / WARM)`, or clamped on a later line of the loop); a decay
    used in a test; one whose length the file's literals show the loop never passes; decays
    whose length the source cannot compare with the loop's.
    """

    code = "GD282"
    slug = "decay-passes-zero"
    severity = Severity.WARNING
    summary = ("a linear decay of the loop's counter (1 - step / N) is sized shorter than the "
               "loop: it turns negative and flips the sign of the weight or lr it scales")
    fix = ("size the decay in the loop's own unit (divide by the loop's total length) or clamp "
           "it: max(0.0, 1 - step / N)")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in decays_past_zero(tree):
                counter, length, stop = hit["counter"], hit["length"], hit["stop"]
                if hit["why"] == "values":
                    how = (f"the loop at line {hit['loop']} runs `{counter}` up to "
                           f"{hit['last'] - 1:g}, past {length} = {hit['size']:g}")
                elif hit["why"] == "factor":
                    how = (f"the loop at line {hit['loop']} runs `{counter}` over `range({stop})`, "
                           f"a product of which `{length}` is only one factor")
                else:
                    how = (f"`{length}` counts epochs while the loop at line {hit['loop']} counts "
                           f"`{counter}` over `range({stop})`")
                total = stop if stop.isidentifier() else f"({stop})"
                yield self.finding(
                    f"`{hit['text']}` reaches 0 when `{counter}` reaches `{length}`, but {how}: "
                    f"for the rest of the loop the factor is negative, so the loss term or "
                    f"learning rate it scales changes sign (the term is maximised, or the update "
                    f"climbs the loss)",
                    Location(path, hit["line"]),
                    evidence={"counter": counter, "length": length, "stop": stop, "why": hit["why"]},
                    fix=(f"divide by the loop's own length (`{counter} / {total}`), or clamp "
                         f"the decay: `max(0.0, {hit['text']})`"))
