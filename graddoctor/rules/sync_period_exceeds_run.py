from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# a call that writes a copy of the model: a target network's sync
_SYNC_METHODS = frozenset({"load_state_dict", "copy_"})
_SYNC_NAME = re.compile(r"sync|hard_update|update_target|target_update|copy_weights|soft_update|polyak")
_MAX = 10 ** 12  # constants beyond this are not plans


def _constant(node: ast.AST, consts: dict[str, int]) -> int | None:
    """The int value of a constant expression: numbers (``10_000``, ``1e4``), names bound once
    to one, ``+ - * //`` of them, ``int(...)`` of one; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) \
            and float(node.value).is_integer() and abs(node.value) < _MAX:
        return int(node.value)
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _constant(node.operand, consts)
        return -value if value is not None else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" \
            and len(node.args) == 1:
        return _constant(node.args[0], consts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
        left, right = _constant(node.left, consts), _constant(node.right, consts)
        if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
            return None
        value = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}.get(
            type(node.op), left // right if right else 0)
        return value if abs(value) < _MAX else None
    return None


def _constants(tree: ast.AST) -> dict[str, int]:
    """Names the file binds exactly once, to a constant int expression (in order)."""
    counts: dict[str, int] = {}
    values: dict[str, ast.AST] = {}
    for node in walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, ast.Name)]
            for t in targets:
                values[t.id] = node.value
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            targets = [node.target]
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                values[node.target.id] = node.value
        elif isinstance(node, (ast.For, ast.comprehension)):
            targets = [n for n in walk(node.target) if isinstance(n, ast.Name)]
        for t in targets:
            counts[t.id] = counts.get(t.id, 0) + 1
    consts: dict[str, int] = {}
    for _ in range(3):  # names defined from names
        for name, value in values.items():
            if counts.get(name) == 1 and name not in consts:
                found = _constant(value, consts)
                if found is not None:
                    consts[name] = found
    return consts


def _range_span(loop: ast.For, consts: dict) -> tuple[int, int] | None:
    """``(first, last)`` value of ``for v in range(...)`` with constant bounds and step 1."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and 1 <= len(it.args) <= 2 and not it.keywords):
        return None
    bounds = [_constant(a, consts) for a in it.args]
    if None in bounds:
        return None
    start, stop = (0, bounds[0]) if len(bounds) == 1 else bounds
    return (start, stop - 1) if stop > start else None


def _syncs(body: list) -> str | None:
    """The text of the first call in ``body`` that writes a model copy, or None."""
    for stmt in body:
        for node in walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else ""
            if name in _SYNC_METHODS or _SYNC_NAME.search(name.lower()):
                return ast.unparse(node)
    return None


def _periodic(test: ast.AST, consts: dict) -> tuple[str, int, int] | None:
    """``(counter, offset, period)`` of ``counter % K == 0`` / ``(counter + c) % K == 0``."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    left, right = test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    if not (isinstance(right, ast.Constant) and right.value == 0 and isinstance(left, ast.BinOp)
            and isinstance(left.op, ast.Mod)):
        return None
    period = _constant(left.right, consts)
    counter, offset = left.left, 0
    if isinstance(counter, ast.BinOp) and isinstance(counter.op, (ast.Add, ast.Sub)):
        c = _constant(counter.right, consts)
        if c is None:
            return None
        offset = c if isinstance(counter.op, ast.Add) else -c
        counter = counter.left
    if period is None or period < 2 or not isinstance(counter, ast.Name):
        return None
    return counter.id, offset, period


def _parents(tree: ast.AST) -> dict:
    parents = {}
    for node in walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _enclosing(node, parents) -> list:
    chain = []
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            break
        chain.append(node)
    return chain


def _counter_max(tree: ast.AST, name: str, parents: dict, consts: dict) -> tuple[int, str] | None:
    """The largest value a step counter reaches, ``(value, how)``: bound once to a constant,
    raised by ``+= 1`` at one place only, under ``for ... in range(...)`` loops of constant
    bounds and no ``while`` loop (the product of their lengths)."""
    starts = [n for n in walk(tree) if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    raises = [n for n in walk(tree) if isinstance(n, ast.AugAssign)
              and isinstance(n.target, ast.Name) and n.target.id == name]
    if len(starts) != 1 or len(raises) != 1 or not isinstance(raises[0].op, ast.Add):
        return None
    start, step = _constant(starts[0].value, {}), _constant(raises[0].value, consts)
    if start is None or step != 1:
        return None
    total, loops = 1, []
    for node in _enclosing(raises[0], parents):
        if isinstance(node, (ast.While, ast.AsyncFor)):
            return None
        if isinstance(node, ast.For):
            span = _range_span(node, consts)
            if span is None:
                return None
            total *= span[1] - span[0] + 1
            loops.append(span[1] - span[0] + 1)
    if not loops:
        return None
    how = " × ".join(str(n) for n in reversed(loops))
    return start + total, (f"`{name}` is raised once per pass of its loops: {how} = {total}"
                           if len(loops) > 1 else f"`{name}` is raised once per pass: {total} passes")


def periods_beyond_run(tree: ast.AST) -> list[dict]:
    """Each ``if counter % K == 0:`` block that writes a model copy (``load_state_dict``,
    ``copy_``, a ``sync``/``hard_update`` call) whose counter never reaches a positive multiple
    of ``K`` in the run as the script plans it: the loop variable of an enclosing ``for ... in
    range(N)``, or a counter raised once per pass of constant ``range`` loops."""
    consts = _constants(tree)
    parents = _parents(tree)
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.If):
            continue
        periodic = _periodic(node.test, consts)
        if periodic is None:
            continue
        sync = _syncs(node.body)
        if sync is None:
            continue
        name, offset, period = periodic
        top = how = None
        for outer in _enclosing(node, parents):
            if isinstance(outer, ast.For) and isinstance(outer.target, ast.Name) and outer.target.id == name:
                span = _range_span(outer, consts)
                if span is not None:
                    top, how = span[1], f"the loop runs {span[1] - span[0] + 1} passes"
                break
        else:
            counted = _counter_max(tree, name, parents, consts)
            if counted is not None:
                top, how = counted
        if top is None:
            continue
        top += offset
        if top < period and top >= 1:
            found.append({"line": node.lineno, "test": ast.unparse(node.test), "period": period,
                          "largest": top, "passes": how, "counter": name, "sync": sync})
    return found


class SyncPeriodExceedsRun(Rule):
    """
    ## What it does
    Reads the script's source, in the files a backward ran from, for a periodic block that
    writes a copy of the model — a target network's sync (`target.load_state_dict(
    online.state_dict())`, `tp.data.copy_(p.data)`, a `hard_update`/`sync_target` call) under
    `if step % K == 0:` — whose counter never reaches a positive multiple of `K` in the run as
    the script plans it: the loop variable of the enclosing `for step in range(N)` with `N <=
    K`, or a counter raised once per pass of constant `range` loops (`for episode in range(50):
    for t in range(100): total += 1`) whose product is below `K`. The constants are read where
    the file binds them once (`SYNC_EVERY = 10_000`). It points at the `if`.

    ## Why is this bad?
    The target network is the copy the bootstrap targets are read from; it is meant to follow
    the trained network every `K` updates. A period longer than the whole run never comes
    round (or only at step 0, before any training, when the copy equals its source anyway):
    the targets come from the initial, random network for the whole run, the values learnt
    are regressions onto noise, and nothing fails.

    ## Example
    ```python
    for step in range(5000):
        ...
        if step % 10000 == 0:
            target_net.load_state_dict(q_net.state_dict())
    ```

    ## Use instead
    ```python
    for step in range(5000):
        ...
        if step % 500 == 0:  # a period well inside the run
            target_net.load_state_dict(q_net.state_dict())
    ```

    ## Stays silent on
    A period the run reaches; a periodic block that writes no model copy (logging, evaluation,
    a checkpoint); bounds that are not constants in the file (command-line arguments), or a
    counter under a `while` loop or raised at several places; periods in a loop whose counter
    is another name than the loop's.
    """

    code = "GD378"
    slug = "sync-period-exceeds-run"
    severity = Severity.WARNING
    summary = ("a target network's sync period (if step % K == 0) is longer than the run the "
               "script plans: the copy never follows the trained network after its initialisation")
    fix = ("sync the target within the run: a period K well below the number of updates (or a "
           "soft update every step)")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for hit in periods_beyond_run(tree):
                yield self.finding(
                    f"`{hit['sync']}` runs under `if {hit['test']}:`, with a period of "
                    f"{hit['period']}, but `{hit['counter']}` reaches at most {hit['largest']} in "
                    f"the run the script plans ({hit['passes']}): the sync never comes round after "
                    f"the start of the run (at most at 0, when the copy still equals its source), so "
                    f"the copy keeps its initial weights for the whole run and every target read "
                    f"from it comes from an untrained network",
                    Location(path, hit["line"]),
                    evidence={"period": hit["period"], "largest": hit["largest"],
                              "counter": hit["counter"]},
                    fix=(f"use a period well below the run's {hit['largest']} updates (e.g. "
                         f"`{hit['counter']} % {max(1, hit['largest'] // 10)} == 0`), or lengthen "
                         f"the run past {hit['period']} updates"))
