from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_TOLERANCE = 1e-3  # |a + b - 1| above this: not an average


def _constants(tree: ast.AST) -> dict[str, float]:
    """Names the module assigns one number, once (``decay = 0.999``; ``rho, decay = 0.05, 0.99``)."""
    values: dict[str, list] = {}
    for node in walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    targets += list(zip(target.elts, node.value.elts))
                else:
                    targets.append((target, node.value))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append((node.target, None))
        elif isinstance(node, (ast.For, ast.comprehension)):
            targets.append((node.target, None))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                targets.append((ast.Name(arg.arg), None))
        for target, value in targets:
            for name in walk(target):
                if isinstance(name, ast.Name):
                    values.setdefault(name.id, []).append(value)
    out = {}
    for name, assigned in values.items():
        if len(assigned) == 1 and isinstance(assigned[0], ast.Constant) \
                and isinstance(assigned[0].value, (int, float)) and not isinstance(assigned[0].value, bool):
            out[name] = float(assigned[0].value)
    return out


def _value(node: ast.AST, known: dict[str, float]) -> float | None:
    """A coefficient's number: a literal, a module constant, ``1 - x`` of them; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Add, ast.Mult, ast.Div)):
        left, right = _value(node.left, known), _value(node.right, known)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right if right else None
    return None


def _same_text(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _not_convex(a: ast.AST, b: ast.AST, known: dict[str, float],
                same_text: bool = True) -> tuple[str, str] | None:
    """``(a, b)``'s texts when the two weights of ``a * old + b * new`` cannot sum to 1: the same
    expression on both sides (``decay`` and ``decay``; 0.5 excepted), or numbers both in (0, 1)
    whose sum is not 1. A weight of 1 or more on the new value (a momentum buffer's
    ``mul_(m).add_(g)``) is no average and is left out."""
    va, vb = _value(a, known), _value(b, known)
    if va is not None and vb is not None:
        if 0 < va < 1 and 0 < vb < 1 and abs(va + vb - 1) > _TOLERANCE:
            return ast.unparse(a), ast.unparse(b)
        return None
    if same_text and _same_text(a, b) and va is None:
        return ast.unparse(a), ast.unparse(b)
    return None


def _weight_of(product: ast.AST, a: ast.AST | None, known: dict[str, float]) -> ast.AST | None:
    """The weight of a product ``w * v`` / ``v * w``: the side that is a number, a module
    constant, ``1 - x``, or the same expression as ``a``."""
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    for side in (product.left, product.right):
        if _value(side, known) is not None or (a is not None and _same_text(side, a)) \
                or (isinstance(side, ast.BinOp) and isinstance(side.op, ast.Sub)
                    and isinstance(side.left, ast.Constant) and side.left.value == 1):
            return side
    return None


def _accumulator_term(product: ast.AST, acc: str) -> ast.AST | None:
    """The weight of ``w * acc`` / ``acc * w`` (``.data`` on ``acc`` allowed)."""
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    if _root(product.right) == acc and _root(product.left) != acc:
        return product.left
    if _root(product.left) == acc and _root(product.right) != acc:
        return product.right
    return None


def _root(node: ast.AST) -> str:
    """``ema_p`` for ``ema_p``, ``ema_p.data``, ``ema_p.data.copy_``."""
    while isinstance(node, ast.Attribute):
        if node.attr not in ("data",):
            break
        node = node.value
    return ast.unparse(node)


def averages(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, accumulator, old weight, new weight)`` of each running average of tensors whose
    two weights do not sum to 1: ``acc.mul_(a).add_(x, alpha=b)`` (or ``.add_(b * x)``),
    ``acc.copy_(a * acc + b * x)``, ``acc = a * acc + b * x`` (``.data`` on either side)."""
    known = _constants(tree)
    found = []
    for node in walk(tree):
        pair, in_place = None, True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_" \
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Attribute) \
                and node.func.value.func.attr == "mul_" and len(node.func.value.args) == 1:
            acc = _root(node.func.value.func.value)
            a = node.func.value.args[0]
            alpha = next((k.value for k in node.keywords if k.arg == "alpha"), None)
            if alpha is not None and len(node.args) == 1:
                pair = (acc, a, alpha)
            elif alpha is None and len(node.args) == 1:
                weight = _weight_of(node.args[0], a, known)
                if weight is not None:
                    pair = (acc, a, weight)
        else:
            value, acc = None, None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "copy_" and len(node.args) == 1:
                acc, value = _root(node.func.value), node.args[0]
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                # a rebinding is only read with numbers: ``h = a * h + a * x`` may be no average
                acc, value, in_place = _root(node.targets[0]), node.value, False
            if acc is not None and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
                for mine, other in ((value.left, value.right), (value.right, value.left)):
                    a = _accumulator_term(mine, acc)
                    if a is None:
                        continue
                    b = _weight_of(other, a, known)
                    if b is not None and _accumulator_term(other, acc) is None:
                        pair = (acc, a, b)
                    break
        if pair is None:
            continue
        acc, a, b = pair
        bad = _not_convex(a, b, known, same_text=in_place)
        if bad is not None:
            found.append((node.lineno, acc, bad[0], bad[1]))
    return sorted(set(found))


# words of an accumulator that averages what it follows (a name without one may extrapolate on
# purpose: Nesterov's ``x.add_(x - x_prev, alpha=beta)``)
_AVERAGING = ("slow", "ema", "avg", "average", "swa", "polyak", "shadow", "teacher", "target", "mean")


def _difference(node: ast.AST, acc: str) -> tuple[str, int] | None:
    """``(other, sign)`` of ``acc - other`` (sign 1) or ``other - acc`` (sign -1)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        left, right = _root(node.left), _root(node.right)
        if left == acc and right != acc:
            return right, 1
        if right == acc and left != acc:
            return left, -1
    return None


def _scaled_difference(node: ast.AST, acc: str, known) -> tuple[str, int, ast.AST] | None:
    """``(other, sign, weight)`` of ``w * (acc - other)`` (either order of the product)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for weight, diff in ((node.left, node.right), (node.right, node.left)):
            found = _difference(diff, acc)
            if found is not None and _root(weight) != acc:
                return found[0], found[1], weight
    return None


def extrapolations(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, accumulator, followed value, weight)`` of each averaging update that moves its
    accumulator away from the value it follows: ``slow.add_(slow - p, alpha=a)``,
    ``ema.sub_(p - ema, alpha=a)``, ``avg += a * (avg - p)``; the weights ``1 + a`` and ``-a``
    sum to 1 but one is negative. Only accumulators named for an average (``_AVERAGING``), and
    positive or unknown weights."""
    known = _constants(tree)
    found = []
    for node in walk(tree):
        acc = other = weight = None
        sign = 0
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("add_", "sub_") and len(node.args) == 1:
            acc = _root(node.func.value)
            direction = 1 if node.func.attr == "add_" else -1
            alpha = next((k.value for k in node.keywords if k.arg == "alpha"), None)
            diff = _difference(node.args[0], acc) if alpha is not None else None
            if diff is not None:
                other, sign, weight = diff[0], diff[1] * direction, alpha
            else:
                scaled = _scaled_difference(node.args[0], acc, known) if alpha is None else None
                if scaled is not None:
                    other, sign, weight = scaled[0], scaled[1] * direction, scaled[2]
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            acc = _root(node.target)
            scaled = _scaled_difference(node.value, acc, known)
            if scaled is not None:
                other, weight = scaled[0], scaled[2]
                sign = scaled[1] * (1 if isinstance(node.op, ast.Add) else -1)
        if other is None or sign != 1:
            continue
        if not any(word in acc.lower() for word in _AVERAGING):
            continue
        negated = isinstance(weight, ast.UnaryOp) and isinstance(weight.op, ast.USub)
        value = -_value(weight.operand, known) if negated and _value(weight.operand, known) is not None \
            else _value(weight, known)
        if negated or (value is not None and value <= 0):
            continue
        found.append((node.lineno, acc, other, ast.unparse(weight)))
    return sorted(set(found))


class AverageNotConvex(Rule):
    """
    ## What it does
    Finds a running average of tensors (an EMA of the weights, a Polyak or mean-teacher
    update, a hand-written SWA or running statistic) whose two weights cannot sum to 1: the
    old value kept with `a` and the new one added with `b`, where the source shows the same
    expression for both in an in-place update (`ema.mul_(decay).add_(p, alpha=decay)`,
    `ema.copy_(decay * ema + decay * p)`) or numbers (literals, constants the module assigns
    once) whose sum is not 1 (`ema = 0.99 * ema + 0.1 * p`); or an update that steps an
    accumulator named for an average (`slow`, `ema`, `avg`, `swa`, `teacher`, `target`...) away
    from the value it follows (`slow.add_(slow - p, alpha=a)`, `ema.sub_(p - ema, alpha=a)`,
    `avg += a * (avg - p)`: weights `1 + a` and `-a`). Read from the script's source, in the files whose backwards (or optimizer steps) ran.

    ## Why is this bad?
    An average keeps its scale only when its weights sum to 1. With `a + b > 1` the averaged
    weights grow geometrically (with `decay` on both sides, almost doubling each update), with
    `a + b < 1` they shrink towards zero: the EMA model, teacher or SWA copy that is evaluated,
    distilled from or saved is not an average of the trained model at all. Training itself goes
    on normally, so the loss curve shows nothing; the averaged model's loss explodes (an
    argmax accuracy of a ReLU network can even hide it, since scaling all weights keeps it).

    ## Example
    ```python
    with torch.no_grad():
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p.mul_(decay).add_(p, alpha=decay)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p.mul_(decay).add_(p, alpha=1 - decay)  # or ema_p.lerp_(p, 1 - decay)
    ```

    ## Stays silent on
    `a` and `1 - a` (written either way round, or numbers summing to 1); `lerp_`; a momentum
    buffer (`buf.mul_(m).add_(g)`, `alpha=1 - dampening` of 1: a weight of 1 on the new value is
    no average); a 0.5/0.5 mean of two tensors; weights the source does not give as numbers or
    as one shared expression (`mul_(a).add_(p, alpha=b)` with `a`, `b` computed at run time); a
    rebinding with one shared name on both sides (`h = a * h + a * x`, `loss = lam * loss + lam
    * reg`: not known to be an average); a step toward the followed value
    (`slow.add_(p - slow, alpha=a)`, `ema.sub_(ema - p, alpha=a)`); an extrapolation of an
    accumulator not named for an average (Nesterov's `x.add_(x - x_prev, alpha=beta)`).
    """

    code = "GD352"
    slug = "average-not-convex"
    severity = Severity.WARNING
    summary = ("a running average of tensors (EMA, Polyak, SWA) keeps the old value and adds the "
               "new one with weights that do not sum to 1: the average grows or shrinks geometrically")
    fix = "weight the new value by 1 - (the old value's weight): `.mul_(d).add_(p, alpha=1 - d)`"

    def check(self, a):
        # the files whose backwards ran, or whose optimizer steps did (gradients taken with
        # torch.autograd.grad and written to .grad by hand make no backward event)
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None}
                       | {s.loc.path for s in a.steps if s.loc is not None})
        for path in paths:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, acc, other, weight in extrapolations(tree):
                yield self.finding(
                    f"this update moves `{acc}` away from `{other}`: it adds `{weight}` times "
                    f"`{acc} - {other}`, so `{acc}` keeps weight `1 + {weight}` and `{other}` gets "
                    f"`-{weight}` — an extrapolation past `{acc}`, no average of the values it "
                    f"follows; the averaged (slow, EMA) weights drift away from the trained ones",
                    Location(path, line, None),
                    evidence={"accumulator": acc, "followed": other, "weight": weight},
                    fix=f"step toward the followed value: `{other} - {acc}` in place of `{acc} - {other}`")
            for line, acc, old, new in averages(tree):
                yield self.finding(
                    f"this running average keeps `{acc}` with weight `{old}` and adds the new value "
                    f"with weight `{new}`: the two weights do not sum to 1, so `{acc}` is no average "
                    f"of the values it follows — it grows (or shrinks) by a constant factor at "
                    f"every update, and the averaged model evaluated or saved from it is wrong",
                    Location(path, line, None),
                    evidence={"accumulator": acc, "old_weight": old, "new_weight": new},
                    fix=(f"weight the new value by `1 - {old}`"
                         if old == new or not old.replace(".", "").isdigit() else
                         f"make the two weights sum to 1 (`{old}` and `1 - {old}`)"))
