from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_COUNTER = re.compile(r"(^|_)(step|steps|it|iter|iters|iteration|epoch|update|updates|count|"
                      r"num_updates|optimization_step|global_step|n_iter)$|^(i_?)?step\w*$")
_CAP_NAME = re.compile(r"decay|momentum|beta|ema|max_value|cap")


def _last(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _unwrap(node: ast.AST) -> ast.AST:
    # float(step), step.item(), torch.tensor(step): the counter as it is
    while isinstance(node, ast.Call) and len(node.args) <= 1:
        if isinstance(node.func, ast.Name) and node.func.id in ("float", "int") and node.args:
            node = node.args[0]
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("item", "float") and not node.args:
            node = node.func.value
        else:
            break
    return node


def _counters(node: ast.AST, extra=frozenset()) -> set[str]:
    return {_last(n) for n in walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))
            and (_COUNTER.search(_last(n).lower()) or (isinstance(n, ast.Name) and n.id in extra))}


def _is_ramp(node: ast.AST, extra=frozenset()) -> bool:
    """A fraction that rises with a counter: ``step / warmup``, ``(1 + step) / (10 + step)``."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
        return False
    num, den = _unwrap(node.left), _unwrap(node.right)
    if isinstance(num, ast.BinOp) and isinstance(num.op, ast.Add):
        terms = [_unwrap(num.left), _unwrap(num.right)]
    else:
        terms = [num]
    if not any(isinstance(t, (ast.Name, ast.Attribute)) and _counters(t, extra) for t in terms):
        return False
    if any(isinstance(n, (ast.BinOp, ast.UnaryOp)) and isinstance(getattr(n, "op", None), (ast.Sub, ast.USub))
           for n in walk(num)):
        return False
    # a denominator that grows with the counter too must add more than the numerator does
    return True


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _bindings(tree: ast.AST) -> dict[str, list[tuple[int, ast.AST]]]:
    out: dict[str, list[tuple[int, ast.AST]]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            out.setdefault(ast.unparse(node.targets[0]), []).append((node.lineno, node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[-len(node.args.defaults):] if node.args.defaults else []
            for arg, default in zip(args, node.args.defaults):
                out.setdefault(arg.arg, []).append((node.lineno, default))
                out.setdefault("self." + arg.arg, []).append((node.lineno, default))
    return out


def _resolve(node: ast.AST, binds, line: int) -> ast.AST:
    """The value a plain name or ``self.x`` was last bound to above ``line`` (one binding)."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        text = ast.unparse(node)
        before = [v for ln, v in binds.get(text, ()) if ln <= line]
        if len(before) >= 1 and isinstance(before[-1], (ast.BinOp, ast.Constant, ast.Name, ast.Attribute)):
            value = before[-1]
            if isinstance(value, (ast.Name, ast.Attribute)) and ast.unparse(value) != text:
                return _resolve(value, binds, line)
            return value
    return node


def _capped_later(tree: ast.AST, call: ast.Call, parents) -> bool:
    """The max's result goes through a ``min``/``clamp(max=)`` (a floor and a cap: a window)."""
    node = call
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.Call) and ast.unparse(node.func).rsplit(".", 1)[-1] in ("min", "minimum", "clip"):
            return True
        if isinstance(node, ast.stmt):
            break
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        name = ast.unparse(node.targets[0])
        for other in walk(tree):
            if isinstance(other, ast.Call) and other.lineno > node.lineno and \
                    ast.unparse(other.func).rsplit(".", 1)[-1] in ("min", "minimum") and \
                    any(ast.unparse(a) == name for a in other.args):
                return True
    return False


def _lambda_counter(node: ast.AST, parents) -> frozenset:
    """The one parameter of a lambda around the call (``LambdaLR``'s step)."""
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.Lambda):
            args = node.args.args
            return frozenset({args[0].arg}) if len(args) == 1 else frozenset()
        if isinstance(node, ast.stmt):
            break
    return frozenset()


def maxed_ramps(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``(line, call, cap, ramp, averaging)`` of ``max(cap, ramp)``: a fraction rising with the loop's
    counter, floored at a cap of 1 or at an averaging decay (0.5 or more, or named a decay)."""
    binds = _bindings(tree)
    parents = {id(c): p for p in walk(tree) for c in ast.iter_child_nodes(p)}
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max"
                and len(node.args) == 2 and not node.keywords):
            continue
        for i in (0, 1):
            ramp, cap = node.args[i], node.args[1 - i]
            ramp_value = _resolve(ramp, binds, node.lineno)
            if not _is_ramp(ramp_value, _lambda_counter(node, parents)):
                continue
            cap_value = _resolve(cap, binds, node.lineno)
            number = _number(cap_value)
            if number is not None:
                if number < 0.5:
                    continue
            elif not _CAP_NAME.search(_last(cap).lower()):
                continue
            if _capped_later(tree, node, parents):
                continue
            averaging = number is None or number < 1.0  # an averaging decay, not a factor of 1
            found.append((node.lineno, ast.unparse(node), ast.unparse(cap), ast.unparse(ramp_value), averaging))
            break
    return found


class WarmupRampMaxed(Rule):
    """
    ## What it does
    Finds a warm-up ramp clamped with `max` where `min` was meant: `max(decay, (1 + step) /
    (10 + step))` for an EMA's warm-up decay, `max(1.0, step / warmup_steps)` for a learning
    rate's or a loss weight's warm-up factor. It reads the source of the files a backward ran
    from: a builtin `max` of two values, one a fraction whose numerator is a counter (`step`,
    `epoch`, `it`, `global_step`, `self.num_updates`, `+ 1` allowed) directly or through the
    one binding above it, the other a number of 0.5 or more or a name saying decay or
    momentum (its default value read where a function binds it); a result later capped by a
    `min` left out.

    ## Why is this bad?
    The ramp starts below the cap and rises towards it, so `max` returns the cap from the first
    step: an EMA with a warm-up decay averages from its random initialisation with the full
    decay (0.999 or more), and the averaged model the script evaluates or samples from stays
    close to its initial weights for thousands of steps; a warm-up factor `max(1, step / n)` is
    1 during the warm-up (no warm-up) and then grows without bound (the lr or weight keeps
    rising). Nothing fails.

    ## Example
    ```python
    def get_decay(self, step):
        value = (1 + step) / (10 + step)
        return max(self.decay, value)
    ```

    ## Use instead
    ```python
        return min(self.decay, value)
    ```

    ## Stays silent on
    `min(decay, ramp)` and `min(1.0, step / warmup)`; a floor below 0.5 (`max(1e-8, step /
    warmup)`, `max(0.1, step / warmup)` capped by a `min` later); a falling fraction
    (`max(0.0, 1 - step / total)`, `max(0.01, 1 / (1 + step))`); integer division
    (`max(1, step // period)`).
    """

    code = "GD399"
    slug = "warmup-ramp-maxed"
    severity = Severity.WARNING
    summary = ("a warm-up ramp is clamped with max instead of min: the cap (an EMA decay, a "
               "factor of 1) holds from the first step and the warm-up never happens")
    fix = "clamp the ramp from above: `min(cap, ramp)`"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, call, cap, ramp, averaging in maxed_ramps(tree):
                if averaging:
                    why = (f"the ramp `{ramp}` starts below `{cap}` and rises towards it, so `{call}` "
                           f"is `{cap}` from the first step: the average starts from the random "
                           f"initial weights with the full decay and stays close to them long after "
                           f"the model has learnt")
                else:
                    why = (f"the ramp `{ramp}` rises from 0 through 1, so `{call}` is 1 during the "
                           f"warm-up (no warm-up) and then grows without bound with the counter")
                fixed = call.replace("max(", "min(", 1)
                yield self.finding(
                    f"`{call}` clamps a warm-up ramp from below: {why}",
                    Location(path, line), evidence={"cap": cap, "ramp": ramp},
                    fix=f"clamp it from above: `{fixed}`")
