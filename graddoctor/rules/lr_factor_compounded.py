from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _parents(tree: ast.AST) -> dict:
    parents = {}
    for node in walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _is_lr_item(node: ast.AST) -> bool:
    """``g["lr"]``, ``opt.param_groups[0]["lr"]``."""
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "lr"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def _factor_of(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """``(the lr item, the factor)`` of ``g["lr"] *= f`` or ``g["lr"] = g["lr"] * f``."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) and _is_lr_item(node.target):
        return node.target, node.value
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_lr_item(node.targets[0]) \
            and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Mult):
        item = ast.dump(node.targets[0].slice), ast.unparse(node.targets[0])
        for mine, other in ((node.value.left, node.value.right), (node.value.right, node.value.left)):
            if _is_lr_item(mine) and ast.unparse(mine) == item[1]:
                return node.targets[0], other
    return None


def _telescopes(factor: ast.AST, outer: ast.AST, counters: set[str]) -> bool:
    """Whether the factor (or the one value the loop binds to it) is the ratio of one schedule
    at this step and at the one before (``sched(step) / sched(step - 1)``): its product over the
    steps telescopes to the schedule itself, so compounding it is meant."""
    values = [factor]
    if isinstance(factor, ast.Name):
        values += [sub.value for sub in walk(outer) if isinstance(sub, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == factor.id for t in sub.targets)]
    for value in values:
        if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div)):
            continue
        top, bottom = ast.unparse(value.left), ast.unparse(value.right)
        for c in counters:
            if top != bottom and (bottom.replace(f"{c} - 1", c) == top or top.replace(f"{c} + 1", c) == bottom):
                return True
    return False


def compounded_factors(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``[(line, the statement, the factor, the counter it reads)]`` for each param group's lr
    multiplied in place, inside a training loop, by a factor computed from that loop's counter
    (a warmup ratio, a cosine of the step): the schedule's factor, meant for the base lr, is
    compounded step after step. A factor guarded by a test of the counter (a milestone) and a
    constant factor (a decay applied at each step on purpose) are left out."""
    parents = _parents(tree)
    found = []
    for node in walk(tree):
        pair = _factor_of(node)
        if pair is None:
            continue
        item, factor = pair
        loops, guarded, cur = [], False, node
        while cur in parents and not isinstance(parents[cur], _SCOPES):
            parent = parents[cur]
            if isinstance(parent, _LOOPS) and cur is not getattr(parent, "iter", None):
                loops.append(parent)
            if isinstance(parent, ast.If) and cur in parent.body + parent.orelse:
                guarded = guarded or parent
            cur = parent
        if not loops:
            continue
        group_names = _names(item.value)  # `g` of `for g in opt.param_groups`
        counters = set()
        for loop in loops:
            if isinstance(loop, (ast.For, ast.AsyncFor)) and _names(loop.target) & group_names:
                # the loop over the groups visits each group once: its index (a layer's depth
                # in `for depth, g in enumerate(opt.param_groups)`) counts groups, not steps
                continue
            if isinstance(loop, (ast.For, ast.AsyncFor)):
                counters |= _names(loop.target) - group_names
            for sub in walk(loop):
                if isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Add) and isinstance(sub.target, ast.Name):
                    counters.add(sub.target.id)
        if not counters:
            continue
        if guarded and _names(guarded.test) & counters:
            continue  # `if epoch in milestones: g["lr"] *= gamma`
        reads = _names(factor) & counters
        if not reads:
            outer = loops[-1]
            wanted = _names(factor)
            for sub in walk(outer):
                if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted
                                                       for t in sub.targets):
                    reads |= _names(sub.value) & counters
        if reads and not _telescopes(factor, loops[-1], counters):
            found.append((node.lineno, ast.unparse(node), ast.unparse(factor), sorted(reads)[0]))
    return sorted(found)


class LrFactorCompounded(Rule):
    """
    ## What it does
    Finds a hand-written learning-rate schedule that multiplies a param group's lr in place by
    a factor computed from the step (`g["lr"] *= warmup_factor`, `g["lr"] = g["lr"] *
    cosine(step)`), inside the training loop: the factor, meant to scale the base lr, is
    applied on top of the previous step's scaled lr. Read from the script's source, in the
    files whose backwards ran; it points at the multiplication.

    ## Why is this bad?
    A schedule's factor says what share of the base lr this step should use. Multiplied into
    the lr each step, the lr becomes the product of all the factors so far: a linear warmup
    over 10 steps leaves `0.1 * 0.2 * ... * 1`, about 4e-7 of the base lr, before the warmup
    even ends, and a cosine drives it to zero long before the run's end. The model stops
    learning early and nothing fails.

    ## Example
    ```python
    for step in range(steps):
        f = min(1.0, (step + 1) / warmup)
        for g in opt.param_groups:
            g["lr"] *= f
    ```

    ## Use instead
    ```python
    for step in range(steps):
        f = min(1.0, (step + 1) / warmup)
        for g in opt.param_groups:
            g["lr"] = base_lr * f * g.get("lr_scale", 1.0)
    ```

    ## Stays silent on
    A constant decay applied each step or epoch (`g["lr"] *= 0.99`, `*= gamma`: compounding on
    purpose); a multiplication under a test of the counter (`if epoch in milestones`); an lr
    set from the base lr; multiplications outside a loop, or in the loop over the groups
    alone by a factor of the group's index (a layer-wise decay set once:
    `for depth, g in enumerate(opt.param_groups): g["lr"] *= decay ** depth`); the ratio of a
    schedule at this step to the one before (`sched(step) / sched(step - 1)`: the product
    telescopes to the schedule, the recursive form of PyTorch's own schedulers).
    """

    code = "GD380"
    slug = "lr-factor-compounded"
    severity = Severity.WARNING
    summary = ("a schedule's factor, computed from the step, multiplies the param group's lr in "
               "place each step: the factors compound and the lr collapses")
    fix = "set the lr from the base lr each step: g['lr'] = base_lr * factor"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, factor, counter in compounded_factors(tree):
                yield self.finding(
                    f"`{text}` multiplies the lr the group already has by `{factor}`, which is "
                    f"computed from `{counter}` each pass of the loop: the factors compound, so the "
                    f"lr becomes the product of every step's factor instead of the base lr times "
                    f"this step's, and it collapses towards zero",
                    Location(path, line), evidence={"statement": text, "factor": factor, "counter": counter},
                    fix="keep the base lr and set the group's lr from it: "
                        f"g['lr'] = base_lr * {factor}")
