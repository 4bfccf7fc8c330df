from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_CENTRES = ("mean", "nanmean")
_SCALES = ("std", "nanstd", "var", "nanvar")
_MODULES = ("np", "numpy", "torch")


def _axis(node: ast.AST | None):
    """A reduction's axis as a comparable value: None (every element), a sorted tuple of ints,
    or the expression's text when it is not a literal."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return (node.value,)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return (-node.operand.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) and isinstance(e.value, int)
                                                       for e in node.elts):
        return tuple(sorted(e.value for e in node.elts))
    return ast.unparse(node)


def statistic(node: ast.AST) -> tuple[str, str, object, str] | None:
    """``(role, receiver, axis, call)`` of a mean or spread reduction (``x.mean(axis=0)``,
    ``np.std(x)``, ``torch.var(x, dim=0)``); role is "centre" or "scale", call the reduction's
    text with the axis left for the caller (``x.std({})``, ``np.std(x, {})``); None for anything
    else. A ``stat + eps`` or ``sqrt(var)`` is read as its statistic."""
    while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) \
            and isinstance(node.right, ast.Constant):
        node = node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sqrt" \
            and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "clamp" \
            and isinstance(node.func.value, ast.Call):
        node = node.func.value
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    name = node.func.attr
    if name not in _CENTRES + _SCALES:
        return None
    role = "centre" if name in _CENTRES else "scale"
    keyword = next((k.value for k in node.keywords if k.arg in ("axis", "dim")), None)
    owner = node.func.value
    if isinstance(owner, ast.Name) and owner.id in _MODULES:  # np.std(x, axis=0)
        if not node.args:
            return None
        receiver, positional = node.args[0], node.args[1] if len(node.args) > 1 else None
    else:  # x.std(0)
        receiver, positional = owner, node.args[0] if node.args else None
    word = next((k.arg for k in node.keywords if k.arg in ("axis", "dim")), None) or (
        "dim" if isinstance(owner, ast.Name) and owner.id == "torch" else "")
    if isinstance(owner, ast.Name) and owner.id in _MODULES:
        call = f"{owner.id}.{name}({ast.unparse(receiver)}, {{}})"
    else:
        call = f"{ast.unparse(receiver)}.{name}({{}})"
    call = call + "\0" + word  # the keyword this reduction names its axis with, if any
    return role, ast.unparse(receiver), _axis(keyword if keyword is not None else positional), call


def _bindings(tree: ast.AST) -> dict[str, list[tuple[int, tuple]]]:
    """Each name assigned a statistic: ``[(line, statistic), ...]`` (``m, s = x.mean(0), x.std()``
    included)."""
    out: dict[str, list] = {}
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = [(target, value)]
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))
        for t, v in pairs:
            stat = statistic(v)
            if isinstance(t, ast.Name) and stat is not None:
                out.setdefault(t.id, []).append((node.lineno, stat))
    return out


def _resolve(node: ast.AST, bound: dict, line: int) -> tuple[int, tuple] | None:
    """The statistic an operand of a standardisation is: inline, or the latest assignment of its
    name at or above ``line``."""
    stat = statistic(node)
    if stat is not None:
        return line, stat
    inner = node
    while isinstance(inner, ast.BinOp) and isinstance(inner.op, (ast.Add, ast.Sub)) \
            and isinstance(inner.right, ast.Constant):
        inner = inner.left
    if isinstance(inner, ast.Name) and inner.id in bound:
        above = [b for b in bound[inner.id] if b[0] <= line]
        if above:
            return max(above, key=lambda b: b[0])
    return None


def _filled(call: str, other: str, axis) -> str:
    """``call``'s text reducing over ``axis``, named with the keyword the other statistic uses
    (``dim=`` for torch, ``axis=`` for numpy; positional when neither names one)."""
    template, word = call.split("\0")
    other_word = other.split("\0")[1]
    if axis is None:
        return template.format("").replace(", )", ")")
    value = str(axis[0]) if isinstance(axis, tuple) and len(axis) == 1 else str(axis)
    keyword = other_word or word
    return template.format(f"{keyword}={value}" if keyword else value)


def mixed_axes_standardisations(tree: ast.AST) -> list[tuple[int, str, str, object, object, str]]:
    """``(line, receiver, role, axis, other_axis, call)`` for each ``(x - m) / s`` whose centre
    ``m`` and scale ``s`` reduce the same array over different axes; ``line``, ``role`` and
    ``call`` (``statistic``'s) are the statistic to change's: the one reduced over every element when the other
    names an axis (else the scale), ``other_axis`` the axis the other one reduces. Scripts that
    import pandas are read without the case of an axis-less statistic against axis 0 (a
    DataFrame's ``mean()`` is per column)."""
    uses_pandas = any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
        (a.name or "").split(".")[0] == "pandas" for a in n.names) or (
        isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "pandas")
        for n in walk(tree))
    bound = _bindings(tree)
    found, seen = [], set()
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Sub)):
            continue
        line = node.lineno
        centre = _resolve(node.left.right, bound, line)
        scale = _resolve(node.right, bound, line)
        if centre is None or scale is None or centre[1][0] != "centre" or scale[1][0] != "scale":
            continue
        (c_line, (_, c_recv, c_axis, c_call)), (s_line, (_, s_recv, s_axis, s_call)) = centre, scale
        if c_recv != s_recv or c_axis == s_axis:
            continue
        if uses_pandas and {c_axis, s_axis} == {None, (0,)}:
            continue
        if c_axis is None:
            pick = (c_line, "centre", c_axis, s_axis, _filled(c_call, s_call, s_axis))
        else:
            pick = (s_line, "scale", s_axis, c_axis, _filled(s_call, c_call, c_axis))
        if (pick[0], c_recv) in seen:
            continue
        seen.add((pick[0], c_recv))
        found.append((pick[0], c_recv, pick[1], pick[2], pick[3], pick[4]))
    return found


def _axis_text(axis) -> str:
    if axis is None:
        return "every element"
    if isinstance(axis, tuple):
        return "axis " + (str(axis[0]) if len(axis) == 1 else str(axis))
    return f"axis {axis}"


class StandardisedOverMixedAxes(Rule):
    """
    ## What it does
    Finds a standardisation `(x - m) / s` in a training script whose centre and scale are
    statistics of the same array reduced over different axes: `m = X.mean(axis=0)` per feature
    with `s = X.std()` over every element, or a mean over rows against a spread over columns.
    Read from the script's source (numpy's and torch's `mean`/`std`/`var`, as methods or
    functions, inline or through the names they are assigned to), in the files whose backwards
    ran. Reported at the statistic that reduces over every element when the other names an
    axis (else at the scale).

    ## Why is this bad?
    A per-feature mean with one global standard deviation leaves every feature at its own
    scale: a column in the hundreds stays hundreds of times larger than a column in the tenths,
    whose values the first layer barely sees, and the global spread (dominated by the largest
    columns and by the offsets between them) shrinks the rest toward zero. Training still
    runs, but the model fits the large columns first and slowly, and the small ones not at all —
    exactly what standardising was meant to prevent.

    ## Example
    ```python
    mean = X_train.mean(axis=0)
    std = X_train.std()
    X = (X_train - mean) / std
    ```

    ## Use instead
    ```python
    mean = X_train.mean(axis=0)
    std = X_train.std(axis=0)
    X = (X_train - mean) / std
    ```

    ## Stays silent on
    Statistics over the same axes (a global `x.mean()` with `x.std()` for pixels, per channel
    `axis=(0, 2, 3)` for both); the centre and scale of different arrays (train statistics
    applied to a validation set are its arrays' concern, not this rule's); in a script that
    imports pandas, an axis-less statistic against `axis=0` (a DataFrame reduces per column by
    default); statistics bound to a name the script reassigns in between, beyond the latest
    assignment above the standardisation; scripts whose backwards ran in another file.
    """

    code = "GD330"
    slug = "standardised-over-mixed-axes"
    severity = Severity.WARNING
    summary = ("a standardisation (x - m) / s whose mean and standard deviation reduce the same "
               "array over different axes: the features keep their own scales")
    fix = "reduce the mean and the standard deviation over the same axis (axis=0 for per-feature statistics)"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, receiver, role, axis, other, call in mixed_axes_standardisations(tree):
                which = "mean" if role == "centre" else "standard deviation"
                partner = "standard deviation" if role == "centre" else "mean"
                yield self.finding(
                    f"`{receiver}` is standardised with a {which} over {_axis_text(axis)} and a "
                    f"{partner} over {_axis_text(other)}: each feature is not scaled by its own "
                    f"spread, so the features keep scales that differ by their ratio and the "
                    f"smaller ones barely reach the model",
                    Location(path, line, None),
                    evidence={"array": receiver, "axis": repr(axis), "other_axis": repr(other)},
                    fix=(f"reduce this {which} over the same axis as the {partner}: "
                         f"`{call}`"
                         if other is not None else
                         f"reduce the {partner} over every element too, or both over the features' axis"))
