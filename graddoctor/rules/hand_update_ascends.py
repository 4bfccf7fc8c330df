from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

_MEASURED = 2  # hand-written updates measured, at least
# an update climbs when its cosine with the gradient it applied is above _ALONG_EACH at every
# measured update and above _ALONG on average: an adaptive update (Adam, RMSprop, a sign)
# written with the wrong sign meets its gradient at +0.2 to +0.7 only, while a descending one
# stays below 0 and a perturbation that climbs and is taken back (SAM's) alternates signs
_ALONG_EACH = 0.1
_ALONG = 0.3
_IN_PLACE_ADDS = {"add_", "addcdiv_", "addcmul_"}
# what a quantity to minimise is called, on the line that backpropagates it
_LOSS_WORDS = re.compile(r"loss|criterion|cost|err|nll|mse|bce|crossentropy|cross_entropy", re.I)


def _reads_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in walk(node))


def _negative(node: ast.AST | None) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)


def _receiver_name(node: ast.AST) -> str:
    """``p`` for ``p`` and ``p.data``, ``model.w`` for ``model.w.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return ast.unparse(node)


def _graded(tree: ast.AST) -> set[str]:
    """What the code reads a ``.grad`` of: the tensors an update may be written to."""
    return {ast.unparse(n.value) for n in walk(tree) if isinstance(n, ast.Attribute) and n.attr == "grad"}


def _positive_scale(call: ast.Call) -> bool:
    scale = next((k.value for k in call.keywords if k.arg in ("alpha", "value")), None)
    return not _negative(scale) and not any(map(_negative, call.args))


def _adaptive_climbs(tree: ast.AST) -> list[int]:
    """Lines of a hand-written adaptive update that adds its step to a parameter whose ``.grad``
    the same function reads: ``p.addcdiv_(m_hat, v_hat.sqrt() + eps, value=lr)``."""
    lines = []
    for func in walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        graded = _graded(func)
        for node in walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _IN_PLACE_ADDS and not any(map(_reads_grad, node.args)) \
                    and _receiver_name(node.func.value) in graded and _positive_scale(node):
                lines.append(node.lineno)
    return sorted(set(lines))


def _climbing_lines(tree: ast.AST) -> list[int]:
    """Lines that add a gradient to a tensor: ``p += lr * p.grad``, ``p.add_(p.grad, alpha=lr)``,
    ``p.data = p.data + lr * p.grad``; else those that add an adaptive step made from it."""
    lines = []
    graded = _graded(tree)
    for node in walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _reads_grad(node.value) \
                and not _negative(node.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "add_" and any(map(_reads_grad, node.args)) \
                and _receiver_name(node.func.value) in graded and _positive_scale(node):
            lines.append(node.lineno)  # not a moment's average: exp_avg.mul_(b1).add_(p.grad)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) \
                and isinstance(node.value.op, ast.Add) and _reads_grad(node.value):
            lines.append(node.lineno)
    return sorted(lines) or _adaptive_climbs(tree)


class HandUpdateAscends(Rule):
    """
    ## What it does
    Finds a hand-written update (no `torch.optim` optimizer) that moves a model's parameters
    *along* the gradient of the loss it backpropagates, `p += lr * p.grad` instead of
    `p -= lr * p.grad`: gradient ascent. graddoctor measures, for the first few updates, the
    cosine between how the parameters changed and the gradient that was applied; plain SGD
    gives -1, this bug +1.

    ## Why is this bad?
    The gradient points to where the loss grows. Adding it makes every update increase the
    loss: the model gets worse at each step and soon overflows, while nothing fails at once.

    ## Example
    ```python
    loss = criterion(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p += lr * p.grad
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    ```

    ## Stays silent on
    Updates that go down the gradient (SGD, momentum or Adam written by hand, weight decay);
    an objective maximised on purpose by a hand-written Adam (`log_lik.backward()`, then
    `p.addcdiv_(m_hat, denom, value=lr)`: the backpropagated value is not called a loss);
    a perturbation optimised against a model (PGD's `delta`, a plain tensor: meant to climb); an
    objective that is maximised on purpose and not called a loss (`objective.backward()`, a
    policy's return); parameters on an accelerator (not read).
    """

    code = "GD128"
    slug = "hand-update-ascends"
    severity = Severity.WARNING
    summary = ("a hand-written update adds the gradient to the parameters (p += lr * p.grad): "
               "every update increases the loss")
    fix = "subtract the gradient: p -= lr * p.grad (or p.add_(p.grad, alpha=-lr))"

    def check(self, a):
        if a.optimizers:
            return  # an optimizer's step goes down the gradient of what it is given
        measured = [b for b in a.by_kind.get("backward", ()) if b.get("hand_step_cosine") is not None]
        if len(measured) < _MEASURED or not all(b["hand_step_cosine"] > _ALONG_EACH for b in measured) \
                or sum(b["hand_step_cosine"] for b in measured) / len(measured) <= _ALONG:
            return
        first = measured[0]
        if first.loc is None or not _LOSS_WORDS.search(a.source.line_text(first.loc.path, first.loc.line)):
            return  # not said to be a loss: an objective may be climbed on purpose
        loc = first.loc
        tree = a.source.tree(loc.path)
        lines = _climbing_lines(tree) if tree is not None else []
        if lines:
            loc = Location(loc.path, next((n for n in lines if n > first.loc.line), lines[0]))
        cosines = [round(b["hand_step_cosine"], 2) for b in measured]
        params = sorted({p for b in measured for p in b.get("updated_by_hand") or ()})
        yield self.finding(
            f"the hand-written update moves {a.names(params) if params else 'the parameters'} along "
            f"the gradient of the loss: the cosine between each measured update and the gradient it "
            f"applied is {', '.join(f'{c:+.2f}' for c in cosines)} (descent gives -1). Every update "
            f"increases the loss it backpropagates",
            loc,
            related=(related(first, "the backward whose gradient the update adds"),),
            evidence={"cosines": cosines, "params": a.param_names(params)})
