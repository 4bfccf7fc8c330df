from __future__ import annotations

import ast

from ..analysis.windows import typical
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _grad_of(node: ast.AST) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"


def _rescales_grad(stmt: ast.stmt) -> bool:
    """``p.grad.mul_(c)``, ``p.grad.div_(k)``, ``p.grad *= c``, ``p.grad /= k``,
    ``p.grad = p.grad / k``."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return isinstance(func, ast.Attribute) and func.attr in ("mul_", "div_") and _grad_of(func.value)
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.op, (ast.Mult, ast.Div)) and _grad_of(stmt.target)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _grad_of(stmt.targets[0]):
        value = stmt.value
        return isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.Div)) \
            and _grad_of(value.left) and ast.unparse(value.left) == ast.unparse(stmt.targets[0])
    return False


def _statements(body: list, under_if: bool, over_params: bool):
    """``(statement, under an if, inside a loop over parameters)`` of a loop's body, nested
    functions and classes left out."""
    for stmt in body:
        yield stmt, under_if, over_params
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If):
            yield from _statements(stmt.body + stmt.orelse, True, over_params)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            params = over_params or "param" in ast.unparse(stmt.iter)
            yield from _statements(stmt.body + stmt.orelse, under_if, params)
        elif isinstance(stmt, (ast.While, ast.With, ast.AsyncWith, ast.Try)):
            inner = list(stmt.body) + list(getattr(stmt, "orelse", [])) + list(getattr(stmt, "finalbody", []))
            for handler in getattr(stmt, "handlers", []):
                inner += handler.body
            yield from _statements(inner, under_if, over_params)


def rescaled_per_micro_batch(tree: ast.AST, first: int, last: int) -> tuple[int, str] | None:
    """``(line, text)`` of a statement rescaling parameters' gradients in place (inside a loop
    over parameters, or an attribute's ``.grad``) at every pass of the loop spanning lines
    ``first``..``last`` (under no ``if`` of it), while that loop calls ``.step()`` under an
    ``if`` only; None otherwise."""
    loop = next((n for n in walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))
                 and n.lineno == first and (n.end_lineno or n.lineno) == last), None)
    if loop is None:
        return None
    found, steps = None, []
    for stmt, under_if, over_params in _statements(loop.body, False, False):
        for call in walk(stmt) if not isinstance(stmt, (ast.If, ast.For, ast.While, ast.With,
                                                             ast.AsyncFor, ast.AsyncWith, ast.Try)) else ():
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and call.func.attr == "step" and not call.args:
                steps.append(under_if)
        if found is None and not under_if and _rescales_grad(stmt):
            target = stmt.value.func.value if isinstance(stmt, ast.Expr) else (
                stmt.target if isinstance(stmt, ast.AugAssign) else stmt.targets[0])
            owner = target.value.value if isinstance(target, ast.Attribute) and target.attr == "data" \
                else target.value
            if over_params or isinstance(owner, ast.Attribute):
                found = (stmt.lineno, ast.unparse(stmt))
    if found is None or not steps or not all(steps):
        return None
    return found


class AccumulatedGradsRescaled(Rule):
    """
    ## What it does
    Finds gradient accumulation whose gradients are rescaled in place at every micro-batch
    (`for p in model.parameters(): p.grad.mul_(1 / k)`, `p.grad /= k`) while the optimizer
    steps only once every k micro-batches: each rescaling also shrinks what the window's earlier
    micro-batches accumulated. Read from the accumulation windows (k >= 2 backwards of one line
    between two steps) and the loop around that backward in the script's source: the rescaling
    runs under no `if` of the loop, the step under one.

    ## Why is this bad?
    The i-th of a window's k micro-batches is rescaled k - i + 1 times: with a factor 1/k the
    first one weighs 1/k^k, the last 1/k, so the update is mostly the window's last micro-batch
    and much smaller than the mean gradient meant. Nothing fails; accumulation just does not
    average.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss_fn(model(x), y).backward()
        for p in model.parameters():
            p.grad.mul_(1.0 / k)
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    A rescaling under the step's `if` (once per window, right before the step); a step after
    every micro-batch (nothing accumulates); a rescaling of a tensor's gradient that is not a
    parameter's (an input's gradient for an attack).
    """

    code = "GD351"
    slug = "accumulated-grads-rescaled"
    severity = Severity.WARNING
    summary = ("gradients are rescaled in place at every micro-batch of an accumulation window: "
               "earlier micro-batches are shrunk again at each one")
    fix = "rescale once per window, right before the step, or divide the loss by k instead"

    def check(self, a):
        seen = set()
        for opt, windows in a.windows.items():
            k = typical([len(w.group) for w in windows], [a.weight(w.step) for w in windows])
            if k is None or k < 2:
                continue
            lines = {(b.loc.path, b.loc.line) for w in windows if len(w.group) >= 2
                     for b in w.group if b.loc is not None}
            for path, line in sorted(lines):
                loop = a.source.innermost_loop(path, line)
                tree = a.source.tree(path)
                if loop is None or tree is None or (path, loop) in seen:
                    continue
                seen.add((path, loop))
                found = rescaled_per_micro_batch(tree, *loop)
                if found is None:
                    continue
                at, text = found
                yield self.finding(
                    f"`{text}` runs at every micro-batch, while the {a.optimizer_name(opt)} step "
                    f"runs once every k = {k}: each rescaling also shrinks the gradients the "
                    f"window's earlier micro-batches accumulated, so the i-th of them is rescaled "
                    f"k - i + 1 times and the update is mostly the last micro-batch's",
                    Location(path, at),
                    fix=("move the rescaling under the step's `if` (once per window, right before "
                         "the step), or divide the loss by k instead"),
                    evidence={"k": k, "statement": text, "backward_line": line})
