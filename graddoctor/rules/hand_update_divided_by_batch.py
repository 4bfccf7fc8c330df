from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

_MEASURED = 2  # hand-written updates whose size was measured, at least
_AGREES = 0.02  # relative gap between the measured step and lr / batch the source names
# names of a batch's size (the divisor): batch_size, bs, bsz, B, N, n_batch, args.batch_size
_BATCH_NAME = re.compile(r"^(bs|bsz|b|n|n_?samples|num_?samples|num_?examples|mb)$|batch", re.I)


def _reads_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in walk(node))


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:
        return ""


def _batch_divisor(node: ast.AST) -> bool:
    """A batch's size: a name or attribute called so, ``len(x)``, ``x.shape[0]``,
    ``x.size(0)``."""
    if isinstance(node, ast.Name):
        return bool(_BATCH_NAME.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(_BATCH_NAME.search(node.attr))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" \
            and len(node.args) == 1:
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "shape" and isinstance(node.slice, ast.Constant) \
            and node.slice.value == 0:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
        return True
    return False


def _negative(node) -> bool:
    """``-e``, ``-lr / n``, ``-lr * k``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)) \
        and _negative(node.left)


def _update_of(node: ast.AST):
    """The expression a descent statement subtracts (``p -= e``, ``p.sub_(e)``,
    ``p.data = p.data - e``, ``p.add_(g, alpha=-e)``), or None."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) and _reads_grad(node.value):
        return node.value
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) \
            and isinstance(node.value.op, ast.Sub) and _reads_grad(node.value.right):
        return node.value.right
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
            and isinstance(node.value.func, ast.Attribute):
        call = node.value
        if call.func.attr == "sub_" and call.args and _reads_grad(call.args[0]):
            return call.args[0]
        if call.func.attr == "add_" and call.args and _reads_grad(call.args[0]):
            alpha = next((k.value for k in call.keywords if k.arg == "alpha"), None)
            if _negative(alpha):
                return ast.BinOp(left=call.args[0], op=ast.Mult(), right=alpha)
    return None


def divided_updates(tree: ast.AST) -> list[tuple[int, str, ast.AST, list]]:
    """``(line, the divisor's text, the divisor, the other factors)`` of each descent update in
    the file that divides the gradient by a batch's size."""
    out = []
    for node in walk(tree):
        expr = _update_of(node)
        if expr is None:
            continue
        for sub in walk(expr):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div) and _batch_divisor(sub.right):
                factors = [n for n in walk(expr) if isinstance(n, (ast.Name, ast.Attribute))
                           and not _reads_grad(n) and n is not sub.right
                           and not any(n is m for m in walk(sub.right))]
                out.append((node.lineno, _text(sub.right), sub.right, factors))
                break
    return sorted(out, key=lambda t: t[0])


def _constants(tree: ast.AST) -> dict[str, float]:
    """Module-level names bound once to a number (``lr = 0.03``, ``lr, epochs = 0.03, 3``)."""
    seen: dict[str, list] = {}
    for node in getattr(tree, "body", []):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = []
        if isinstance(target, ast.Name):
            pairs = [(target, value)]
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))
        for t, v in pairs:
            if isinstance(t, ast.Name):
                ok = isinstance(v, ast.Constant) and type(v.value) in (int, float)
                seen.setdefault(t.id, []).append(v.value if ok else None)
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and v[0] is not None}


class HandUpdateDividedByBatch(Rule):
    """
    ## What it does
    Finds a hand-written SGD update that divides the gradient by the batch size while the loss
    it applies is already a mean over the batch: d2l's `param -= lr * param.grad / batch_size`
    kept after the loss became `l.mean()` or `nn.MSELoss()`. graddoctor measures, at the first
    hand-written updates, the step each one applied (the change of the tensors over the
    gradient, for an update that is the gradient times one number); the loss's reduction comes
    from its autograd graph; the division from the update's source line.

    ## Why is this bad?
    The mean already divides the gradient by the batch size. Dividing again makes every step
    `lr / batch_size` instead of `lr`: 32× or 256× smaller steps than the lr you tuned, so the
    model learns very slowly and a larger batch trains slower still. Nothing fails.

    ## Example
    ```python
    def sgd(params, lr, batch_size):
        with torch.no_grad():
            for param in params:
                param -= lr * param.grad / batch_size
                param.grad.zero_()

    l = loss(net(X), y)          # nn.MSELoss(): a mean
    l.backward()
    sgd([w, b], lr, batch_size)
    ```

    ## Use instead
    ```python
    l.sum().backward()           # d2l's convention: the sum, divided once by the update
    # or keep the mean and drop the division: param -= lr * param.grad
    ```

    ## Stays silent on
    A sum-reduced loss divided by the batch size in the update (d2l's own `sgd` with
    `l.sum().backward()`, `reduction="sum"` with `lr / batch_size`); a mean loss with
    `p -= lr * p.grad`; a division by anything that is not a batch's size (a step count, a
    gradient norm); gradients accumulated over several backwards before the update (a
    division by the accumulation steps); momentum or Adam written by hand (not the gradient
    times one number); an update whose measured step does not match `lr / batch_size` where
    the source gives both numbers; tensors on an accelerator (not read).
    """

    code = "GD277"
    slug = "hand-update-divided-by-batch"
    severity = Severity.WARNING
    summary = ("a hand-written SGD update divides the gradient by the batch size while the loss "
               "is already a mean over the batch: every step is lr / batch_size")
    fix = ("divide once: keep the mean loss and update with `param -= lr * param.grad`, or "
           "backpropagate the sum (`l.sum().backward()`) and keep the division")

    def check(self, a):
        backwards = list(a.by_kind.get("backward", ()))
        measured = [b for b in backwards if b.get("hand_step_scale") is not None]
        if len(measured) < _MEASURED:
            return
        last = measured[-1].seq
        upto = [b for b in backwards if b.seq <= last]
        if any(b.get("accumulated") for b in upto):
            return  # gradients accumulated over backwards: a division by the window is due
        if not all((b.get("loss_terms") or [None]) and all(t == "mean" for t in b.get("loss_terms") or [None])
                   for b in upto):
            return  # the loss is not (only) a mean over the batch
        first = measured[0]
        if first.loc is None:
            return
        tree = a.source.tree(first.loc.path)
        found = divided_updates(tree) if tree is not None else []
        if len(found) != 1:
            return  # none, or several updates: which one ran is not known
        line, divisor_text, divisor, factors = found[0]
        scales = [b["hand_step_scale"] for b in measured]
        scale = scales[0]
        if max(scales) > scale * (1 + _AGREES) or min(scales) < scale * (1 - _AGREES):
            return  # the step changes between updates (a schedule): not judged
        consts = _constants(tree)
        batch = consts.get(divisor.id) if isinstance(divisor, ast.Name) else None
        lrs = [(n.id, consts[n.id]) for n in factors if isinstance(n, ast.Name) and n.id in consts]
        shown = ""
        if batch is not None:
            if not isinstance(batch, int) or batch <= 1:
                return
            if len(lrs) == 1:
                name, lr = lrs[0]
                if abs(scale * batch - lr) > _AGREES * abs(lr):
                    return  # the step is not lr / batch: something else sets it
                shown = (f", which is {name} / {divisor_text} = {lr:g} / {batch}: {batch}× "
                         f"smaller than the {name} the update names")
            else:
                shown = f", {batch}× smaller than the update's lr"
        loss_line = a.source.line_text(first.loc.path, first.loc.line).split("#")[0].strip()
        loc = Location(first.loc.path, line)
        update = a.source.line_text(first.loc.path, line).split("#")[0].strip()
        yield self.finding(
            f"`{update}` divides the gradient by `{divisor_text}`, but the loss it applies "
            f"(`{loss_line}`) is already a mean over the batch: the gradient is divided by the "
            f"batch size twice. Each measured update moved the parameters by {scale:.3g} × "
            f"their gradient{shown}",
            loc,
            related=(related(first, "the backward of the mean loss"),),
            evidence={"step": scale, "divisor": divisor_text, "batch": batch,
                      "lr": lrs[0][1] if len(lrs) == 1 else None, "line": line})
