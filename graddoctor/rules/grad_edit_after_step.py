from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .accumulated_grads_rescaled import _rescales_grad, _statements
from .base import Rule, related
from ..analysis.source import walk

_COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.AsyncFor, ast.AsyncWith, ast.Try)


def _edited_owner(stmt: ast.stmt) -> ast.AST:
    """The expression whose ``.grad`` a rescaling statement edits (``p`` in ``p.grad.data *= c``)."""
    target = stmt.value.func.value if isinstance(stmt, ast.Expr) else (
        stmt.target if isinstance(stmt, ast.AugAssign) else stmt.targets[0])
    if isinstance(target, ast.Attribute) and target.attr == "data":
        target = target.value
    return target.value


def _zeroes(stmt: ast.stmt) -> bool:
    """``p.grad *= 0``, ``p.grad.mul_(0)``: a gradient cleared by hand, not rescaled."""
    if isinstance(stmt, ast.AugAssign):
        factor = stmt.value
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args:
        factor = stmt.value.args[0]
    else:
        return False
    return isinstance(factor, ast.Constant) and factor.value == 0 and isinstance(stmt, (ast.AugAssign, ast.Expr)) \
        and not (isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Div))


def _calls(stmt: ast.stmt, method: str) -> bool:
    """Whether the simple statement calls ``X.method(...)`` (a compound statement's own header
    only: its body is walked statement by statement)."""
    if isinstance(stmt, _COMPOUND):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
               for n in walk(stmt))


def edits_after_last_step(loop: ast.AST, step_lines: set[int]) -> tuple[int, str, int] | None:
    """``(line, text, step_line)`` of a statement of ``loop``'s body that rescales parameters'
    gradients in place after the body's last optimizer step (a statement on one of
    ``step_lines`` that calls ``.step()``), with no optimizer step after it in the body; None
    when there is none, or when a step runs under an ``if`` the rescaling is not under (a
    window of accumulation: the rescaling may reach the next step)."""
    last_step = None
    step_under_if = False
    candidate = None
    for stmt, under_if, over_params in _statements(loop.body, False, False):
        if stmt.lineno in step_lines and _calls(stmt, "step"):
            last_step, candidate = stmt, None
            step_under_if = step_under_if or under_if
            continue
        if candidate is None and last_step is not None and _rescales_grad(stmt) and not _zeroes(stmt):
            owner = _edited_owner(stmt)
            if over_params or isinstance(owner, ast.Attribute):
                candidate = (stmt, under_if)
    if candidate is None or last_step is None:
        return None
    stmt, under_if = candidate
    if step_under_if and not under_if:
        return None
    return stmt.lineno, ast.unparse(stmt), last_step.lineno


class GradEditAfterStep(Rule):
    """
    ## What it does
    Finds gradients rescaled in place (`p.grad.data *= c`, `p.grad.mul_(c)`, `p.grad /= k`)
    after the loop's last `optimizer.step()`, in a loop whose `zero_grad()` clears them before
    the next step: the rescaling edits gradients that were already applied and are then thrown
    away. Read from the optimizer steps and clears the run recorded and the loop around the
    step in the script's source. The classic case is center loss's centre optimizer,
    whose gradients are divided by the loss weight so that the centres' update does not depend
    on it: written after the centre optimizer's step, the division changes nothing.

    ## Why is this bad?
    The update the optimizer applies is the unedited one: a rescaling meant to undo a loss
    weight (center loss, a per-group factor), to average over workers or to turn a sum into a
    mean never reaches any step. Training runs, with the step size off by exactly the factor the
    edit was there to apply.

    ## Example
    ```python
    loss = xent + weight_cent * center_loss(features, labels)
    optimizer.zero_grad(); optimizer_centloss.zero_grad()
    loss.backward()
    optimizer.step()
    optimizer_centloss.step()
    for param in center_loss.parameters():
        param.grad.data *= 1.0 / weight_cent
    ```

    ## Use instead
    ```python
    loss.backward()
    optimizer.step()
    for param in center_loss.parameters():
        param.grad.data *= 1.0 / weight_cent
    optimizer_centloss.step()
    ```

    ## Stays silent on
    A rescaling between the backward and the step it is meant for (also when another optimizer
    stepped before it); gradients zeroed by hand after the step (`p.grad.zero_()`, `*= 0` is no
    rescaling); a rescaling after a step taken under an `if` (an accumulation window, where it
    reaches the next step); a loop that never clears its gradients; an input's gradient edited
    after the step (an attack's, not a parameter's).
    """

    code = "GD362"
    slug = "grad-edit-after-step"
    severity = Severity.WARNING
    summary = ("gradients are rescaled in place after the optimizer step: the edit reaches no update, "
               "zero_grad() clears it first")
    fix = "move the rescaling before the optimizer.step() it is meant for"

    def check(self, a):
        steps = [e for e in a.by_kind.get("step", ()) if e.loc is not None and not e.get("skipped")]
        clears = [e for e in a.by_kind.get("clear", ()) if e.loc is not None]
        if not steps or not clears:
            return
        seen: set = set()
        for step_event in steps:  # the loop around each step: its later statements
            loc = step_event.loc
            if loc.via:
                continue
            span = a.source.innermost_loop(loc.path, loc.line)
            if span is None or (loc.path, span) in seen:
                continue
            seen.add((loc.path, span))
            first, last = span
            in_loop = [e for e in steps if e.loc.path == loc.path and first <= e.loc.line <= last]
            if not in_loop or not any(e.loc.path == loc.path and first <= e.loc.line <= last for e in clears):
                continue  # no step, or gradients that accumulate across passes of the loop
            tree = a.source.tree(loc.path)
            loop = next((n for n in walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))
                         and n.lineno == first and (n.end_lineno or n.lineno) == last), None) \
                if tree is not None else None
            if loop is None:
                continue
            found = edits_after_last_step(loop, {e.loc.line for e in in_loop})
            if found is None:
                continue
            line, text, step_line = found
            step = next(e for e in in_loop if e.loc.line == step_line)
            name = a.optimizer_name(step["opt"])
            yield self.finding(
                f"`{text}` rescales gradients after the loop's last optimizer step ({name} at line "
                f"{step_line}) and before the zero_grad() that clears them: the rescaling reaches "
                f"no update, so every step applies the unedited gradients",
                Location(loc.path, line),
                related=(related(step, "the step that already applied these gradients"),),
                fix=f"move the rescaling above the step at line {step_line}",
                evidence={"statement": text, "step_line": step_line, "optimizer": name},
            )
