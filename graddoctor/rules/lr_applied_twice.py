from __future__ import annotations

import ast
import re
from dataclasses import replace

from ..findings import Severity
from .base import Rule, related
from .unscaled_accumulation import SCALE_INVARIANT
from ..analysis.source import walk

MIN_STEPS = 3  # single-backward updates whose loss factor equals the lr
MIN_EDITS = 2  # measured hand edits whose factor equals the lr
UNNAMED_BELOW = 0.01  # a loss factor equal to the lr on a line naming no lr: reported below this
_CLOSE = 1e-5  # relative: a factor of float32 gradients equal to an lr written in Python

# a name that holds a learning rate: lr, base_lr, lr_max, learning_rate, get_last_lr(), ["lr"]
_LR_WORD = re.compile(r"(?<![A-Za-z0-9])(?:\w*_)?(?:lr|learning_rate)(?:_\w*)?(?![A-Za-z0-9])"
                      r"|get_last_lr|get_lr|[\"']lr[\"']", re.IGNORECASE)


def _same(x, y) -> bool:
    return (isinstance(x, (int, float)) and isinstance(y, (int, float)) and y > 0
            and abs(x - y) <= _CLOSE * y)


def lr_matches(factor, lrs) -> int | None:
    """The index of the param group whose lr the constant ``factor`` equals (an lr below 1),
    or None."""
    if not isinstance(factor, (int, float)) or not 0 < factor < 1 or not lrs:
        return None
    for g, lr in enumerate(lrs):
        if _same(factor, lr):
            return g
    return None


def loss_factor_is_lr(a, opt, windows) -> bool:
    """Every single-backward update of ``opt`` backpropagated a loss multiplied by a constant
    equal to one of its groups' lrs at that step (``loss * lr``): the case this rule reports,
    which accumulation-never-accumulates leaves to it."""
    found = _loss_matches(a, windows)
    return found is not None and _loss_line(a, windows, found[0]) is not None


class LrAppliedTwice(Rule):
    """
    ## What it does
    Finds the learning rate applied twice: the gradients an optimizer steps with were already
    multiplied by that optimizer's own lr, so its update is `lr² × grad`. Two ways are seen:
    the loss backpropagated is the loss times a constant equal to a param group's lr
    (`(loss * lr).backward()`, read from the autograd graph), or a hand edit between
    `backward()` and `step()` scales every gradient of a group by exactly that group's lr
    (`p.grad *= lr`; graddoctor compares a sample of each gradient before and after the edit on
    the first steps).

    ## Why is this bad?
    `optimizer.step()` multiplies by the lr itself. With lr 1e-2 the update is 100× smaller
    than configured: the model barely moves, while the loss curve looks smooth and slowly
    falling. With Adam-like optimizers the scale mostly cancels, but `eps` and decoupled weight
    decay are then 1/lr times too strong relative to the gradient.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad *= lr          # the optimizer applies lr again
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()          # the update is lr * grad
    ```

    ## Stays silent on
    A loss weight or a hand clip that differs from the lr (`0.5 * loss`, `p.grad *= coef` for a
    norm limit); a loss divided by the accumulation count while the steps accumulate (`loss / 4`
    with lr 0.25 and four micro-batches per step); a hand-written update without an optimizer
    (`p -= lr * p.grad`); a factor equal to the lr on fewer than three updates. A loss factor
    equal to the lr whose line names no learning rate (`loss * 0.1` with lr 0.1) is only
    `info`, and so is an Adam-like optimizer (the scale mostly cancels).
    """

    code = "GD138"
    slug = "lr-applied-twice"
    severity = Severity.WARNING
    summary = ("the gradients are multiplied by the lr before optimizer.step(), which applies the "
               "lr again: the update is lr² × grad")
    fix = "drop the multiplication by the lr: optimizer.step() applies it"

    def check(self, a):
        reported = set()
        for opt, windows in a.windows.items():
            found = _loss_matches(a, windows)
            finding = self._loss_finding(a, opt, windows, *found) if found is not None else None
            if finding is not None:
                reported.add(opt)
                yield finding
        for opt, edits in _edit_matches(a).items():
            if opt not in reported:
                yield self._edit_finding(a, opt, edits)

    def _loss_finding(self, a, opt, windows, factor, group, lrs):
        w = windows[0]
        backward = w.backwards[0]
        cls = a.optimizer_class(opt)
        name = a.optimizer_name(opt)
        line = _loss_line(a, windows, factor)
        if line is None:
            return None
        loc, named = line
        adaptive = cls in SCALE_INVARIANT
        severity = Severity.WARNING if named and not adaptive else Severity.INFO
        which = (f"the lr of its param group {group} ({lrs[group]:g})" if len(lrs) > 1
                 else f"lr ({lrs[group]:g})")
        effect = (f"{cls} mostly cancels a constant factor, but its eps (and decoupled weight "
                  f"decay) then weigh {1 / factor:,.0f}× more against the gradient"
                  if adaptive else
                  f"the update is lr² × grad, {1 / factor:,.0f}× smaller than configured")
        n = a.count(x.step for x in windows)
        return self.finding(
            f"the loss backpropagated is multiplied by {factor:g}, which is {name}'s "
            f"{which}, at each of its {n} updates, and {name}.step() multiplies by the lr "
            f"again: {effect}"
            + ("" if named else " (if the factor is a loss weight that happens to equal the lr, "
               "ignore this)"),
            loc, step=w.index, severity=severity,
            related=(related(w.step, "the step that applies the lr again"),),
            evidence={"factor": factor, "lr": lrs[group], "group": group, "optimizer": opt,
                      "optimizer_class": cls, "steps": n, "how": "loss"},
            fix="backpropagate the loss itself (`loss.backward()`): optimizer.step() applies the "
                "lr")

    def _edit_finding(self, a, opt, edits):
        edit, factors, lrs, step = edits[0]
        cls = a.optimizer_class(opt)
        name = a.optimizer_name(opt)
        groups = [g for g, f in enumerate(factors) if f is not None]
        loc = _edit_line(a, edit) or edit.loc
        adaptive = cls in SCALE_INVARIANT
        shown = ", ".join(f"{lrs[g]:g}" for g in groups)
        effect = (f"{cls} mostly cancels a constant factor, but its eps (and decoupled weight "
                  f"decay) then weigh 1/lr times more against the gradient" if adaptive else
                  "the update is lr² × grad" + (f", {1 / lrs[groups[0]]:,.0f}× smaller than "
                                               f"configured" if len(groups) == 1 else ""))
        whose = ("each param group's gradients are multiplied by exactly that group's lr"
                 if len(groups) > 1 else
                 "every gradient is multiplied by exactly the lr" if len(factors) == 1 else
                 f"every gradient of param group {groups[0]} is multiplied by exactly its lr")
        return self.finding(
            f"before {name}.step(), {whose} ({shown}) at each of the {len(edits)} steps "
            f"measured, and the step multiplies by the lr again: {effect}",
            loc, step=a.step_number.get(step.seq) if step is not None else None,
            severity=Severity.INFO if adaptive else Severity.WARNING,
            related=(related(step, "the step that applies the lr again"),),
            evidence={"factors": factors, "lrs": lrs, "optimizer": opt, "optimizer_class": cls,
                      "edits": len(edits), "how": "grad_edit"},
            fix="drop the multiplication of the gradients by the lr: optimizer.step() applies it")


def _loss_matches(a, windows):
    """``(factor, group, lrs)`` when every update of these windows applied one backward of a
    loss times the lr of a param group at that step (the same group each time), else None."""
    if len(windows) < MIN_STEPS or a.count(w.step for w in windows) < MIN_STEPS:
        return None
    found = None
    for w in windows:
        if w.k != 1 or len(w.backwards) != 1:
            return None  # accumulation (loss / k): the factor is explained
        factor = w.backwards[0].get("loss_scale_factor")
        lrs = _lrs_at(a, w)
        group = lr_matches(factor, lrs)
        if group is None or (found is not None and found[1] != group):
            return None
        found = (factor, group, lrs)
    return found


def _loss_line(a, windows, factor):
    """``(location, named)``: the line that multiplies the loss (the backward's, or the loss's
    assignment above it when that one names an lr) and whether it names a learning rate; None
    when it names none and the factor is large enough to be a loss weight (`loss * 0.1`)."""
    loc = windows[0].backwards[0].loc
    if loc is None:
        return None
    text = a.source.line_text(loc.path, loc.line)
    if not _LR_WORD.search(text):
        assigned = a.source.loss_assignment(loc.path, loc.line)
        if assigned is not None and _LR_WORD.search(assigned[1]):
            loc = replace(loc, line=assigned[0], via="", hook="")
            text = assigned[1]
    named = bool(_LR_WORD.search(text))
    if not named and factor >= UNNAMED_BELOW:
        return None
    return loc, named


def _lrs_at(a, window) -> list | None:
    """The lrs the optimizer read at the window's step (its step_begin, after its backwards)."""
    step = window.step
    begin = next((e for e in reversed(a.span(window.backwards[-1].seq + 1, step.seq - 1))
                  if e.kind == "step_begin" and e.get("opt") == step["opt"]), None)
    return begin.get("lrs") if begin is not None else None


def _edit_matches(a) -> dict:
    """opt -> [(grad_edit, factors, lrs, step)] when every measured hand edit of that optimizer
    scaled each group it scaled by exactly that group's lr, on ``MIN_EDITS`` steps or more."""
    out: dict = {}
    spoiled: set = set()
    pending: dict = {}
    for e in a.events:
        if e.kind == "grad_edit" and e.get("factors"):
            pending[e["opt"]] = e
        elif e.kind == "step_begin" and e["opt"] in pending:
            edit = pending.pop(e["opt"])
            factors, lrs = edit["factors"], e.get("lrs")
            if not lrs or len(lrs) != len(factors) or not all(
                    f is None or _same(f, lr) for f, lr in zip(factors, lrs)):
                spoiled.add(edit["opt"])
                continue
            out.setdefault(edit["opt"], []).append((edit, factors, lrs, None))
        elif e.kind == "step" and e["opt"] in out and out[e["opt"]][-1][3] is None:
            edit, factors, lrs, _ = out[e["opt"]][-1]
            out[e["opt"]][-1] = (edit, factors, lrs, e)
    return {opt: edits for opt, edits in out.items()
            if opt not in spoiled and len(edits) >= MIN_EDITS}


def _edit_line(a, edit):
    """The line that scales ``.grad`` (``p.grad *= lr``, ``p.grad.mul_(lr)``, ``p.grad =
    p.grad * lr``, also through ``.data``) in the lines above the step that the edit was seen at, in the same
    function; None when the source does not show one."""
    loc = edit.loc
    if loc is None:
        return None
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    best = None
    for node in walk(tree):
        line = getattr(node, "lineno", None)
        if line is None or not loc.line - 12 <= line <= loc.line:
            continue
        hit = False
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Mult, ast.Div)):
            hit = _is_grad(node.target)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            hit = _is_grad(node.targets[0]) and isinstance(node.value, ast.BinOp) \
                and isinstance(node.value.op, (ast.Mult, ast.Div))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("mul_", "div_"):
            hit = _is_grad(node.func.value)
        if hit and _LR_WORD.search(ast.unparse(node)) and (best is None or line > best):
            best = line
    return replace(loc, line=best, via="", hook="") if best is not None else None


def _is_grad(node) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"
