from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# name parts that say which image axis a coordinate runs along
_X_WORDS = frozenset(("x", "xs", "xx", "xv", "xg", "gx", "cx", "px", "xi", "xgrid", "gridx",
                      "col", "cols", "column", "columns", "w", "width", "wd"))
_Y_WORDS = frozenset(("y", "ys", "yy", "yv", "yg", "gy", "cy", "py", "yi", "ygrid", "gridy",
                      "row", "rows", "h", "height", "ht"))


def axis_of_name(name: str) -> str | None:
    """``"x"`` or ``"y"`` when a name's parts say one image axis (``grid_x``, ``ys``, ``feat_w``,
    ``rows``), else None."""
    parts = [p for p in re.split(r"[_\d]+", name.lower()) if p]
    found = {"x" for p in parts if p in _X_WORDS} | {"y" for p in parts if p in _Y_WORDS}
    return found.pop() if len(found) == 1 else None


def _axis_of_expr(node: ast.AST) -> str | None:
    """The one axis the names read by an expression say (``torch.arange(w)``,
    ``torch.linspace(-1, 1, self.height)``), else None."""
    found = set()
    for sub in walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
        if name is not None and name not in ("torch", "np", "numpy", "arange", "linspace"):
            axis = axis_of_name(name)
            if axis:
                found.add(axis)
    return found.pop() if len(found) == 1 else None


def _meshgrid(call: ast.AST) -> tuple[list[ast.AST], str] | None:
    """The coordinate arguments and the indexing of a ``torch.meshgrid`` / ``np.meshgrid`` call
    (torch's default is "ij", numpy's "xy"), else None."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "meshgrid" and isinstance(call.func.value, ast.Name)
            and call.func.value.id in ("torch", "np", "numpy")):
        return None
    indexing = "ij" if call.func.value.id == "torch" else "xy"
    for kw in call.keywords:
        if kw.arg == "indexing":
            if not (isinstance(kw.value, ast.Constant) and kw.value.value in ("ij", "xy")):
                return None
            indexing = kw.value.value
    args = list(call.args)
    if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
        args = list(args[0].elts)
    if any(isinstance(a, ast.Starred) for a in args):
        return None
    return args, indexing


def _order_matters(scope: ast.AST, names: tuple[str, str], after: int) -> bool:
    """Whether the script uses the two grids where swapping them changes the result: one
    combined with another coordinate of its own axis (``(xs - cx) ** 2``), or both stacked
    in order (``torch.stack([xs, ys], -1)``). A symmetric use (``xs ** 2 + ys ** 2``) is not."""
    for node in walk(scope):
        if getattr(node, "lineno", 0) <= after:
            continue
        if isinstance(node, ast.BinOp):
            sides = (node.left, node.right)
            for side, other in (sides, sides[::-1]):
                if isinstance(side, ast.Name) and side.id in names:
                    axis = axis_of_name(side.id)
                    for sub in walk(other):
                        if isinstance(sub, ast.Name) and sub.id not in names \
                                and axis_of_name(sub.id) == axis:
                            return True
        if isinstance(node, (ast.List, ast.Tuple)):
            elts = [e.id for e in node.elts if isinstance(e, ast.Name)]
            if all(n in elts for n in names):
                return True
    return False


def swapped_meshgrids(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``(line, text, first name, axis it should be, indexing)``: ``a, b = meshgrid(...)`` whose
    first output is named for the other image axis than the one it holds. Output k holds the
    values of argument k: when the arguments name their axes (``arange(h)``, ``arange(w)``)
    the outputs must name the same ones; when they do not (one ``arange(n)`` twice), "ij"'s
    first output runs down the rows (y) and "xy"'s along the columns (x)."""
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    found = []
    for scope in scopes[::-1]:
        body = scope.body if hasattr(scope, "body") else []
        for node in (n for stmt in body for n in walk(stmt)):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == 2
                    and all(isinstance(e, ast.Name) for e in node.targets[0].elts)):
                continue
            if node.lineno in seen:
                continue
            seen.add(node.lineno)
            grid = _meshgrid(node.value)
            if grid is None or len(grid[0]) != 2:
                continue
            args, indexing = grid
            names = tuple(e.id for e in node.targets[0].elts)
            out = [axis_of_name(n) for n in names]
            if None in out or out[0] == out[1]:
                continue
            held = [_axis_of_expr(a) for a in args]
            if held[0] and held[1] and held[0] != held[1]:
                first = held[0]
            elif ast.dump(args[0]) == ast.dump(args[1]) or (held[0] is None and held[1] is None):
                if ast.dump(args[0]) != ast.dump(args[1]):
                    continue  # two different ranges that name no axis: either reading fits
                first = "y" if indexing == "ij" else "x"
            else:
                continue
            if out[0] == first or not _order_matters(scope, names, node.lineno):
                continue
            found.append((node.lineno, ast.unparse(node), names[0], first, indexing))
    return sorted(found)


class MeshgridAxesSwapped(Rule):
    """
    ## What it does
    Finds a coordinate grid unpacked into names of the wrong image axes:
    `xs, ys = torch.meshgrid(r, r, indexing="ij")`, where the first grid holds the row index
    (it runs down the image: y), or `ys, xs = torch.meshgrid(..., indexing="xy")`
    (`np.meshgrid`'s default), or outputs named for the other axis than the ranges they come
    from (`xs, ys = torch.meshgrid(torch.arange(h), torch.arange(w))`). Reported only where the
    order matters: a grid combined with another coordinate of its axis (`(xs - cx) ** 2`) or
    the two stacked in order. Read from the source of the files a backward ran from.

    ## Why is this bad?
    Every target built from the grid is transposed: Gaussian keypoint heatmaps peak at (y, x)
    instead of (x, y), anchor or point centres sit on the mirrored cell, a flow or sampling
    grid swaps its axes. The model fits the transposed targets and nothing fails; on square
    images not even a shape does. The predictions are wrong wherever x ≠ y.

    ## Example
    ```python
    xs, ys = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    heatmap = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma ** 2))
    ```

    ## Use instead
    ```python
    ys, xs = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    heatmap = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma ** 2))
    ```

    ## Stays silent on
    `ys, xs = meshgrid(..., indexing="ij")` and `xs, ys = meshgrid(..., indexing="xy")`;
    outputs named for the ranges they hold (`xx, yy = torch.meshgrid(torch.arange(W),
    torch.arange(H), indexing="ij")`, a W×H layout kept throughout); grids used symmetrically
    (`xs ** 2 + ys ** 2`); names that say no axis (`ii, jj`); three-dimensional grids.
    """

    code = "GD348"
    slug = "meshgrid-axes-swapped"
    severity = Severity.WARNING
    summary = ("a meshgrid's outputs are named for the wrong image axes: every target built "
               "from them is transposed")
    fix = "swap the names the meshgrid is unpacked into (or its indexing)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, name, first, indexing in swapped_meshgrids(tree):
                what = ("the row index (it runs down the image)" if first == "y"
                        else "the column index (it runs across the image)")
                other = "x" if first == "y" else "y"
                yield self.finding(
                    f"`{text}` names its first grid `{name}` ({other}), but with "
                    f"indexing=\"{indexing}\" it holds {what}, the {first} coordinate: every "
                    f"target built from these grids is transposed, and the model learns the "
                    f"mirrored positions",
                    Location(path, line),
                    evidence={"name": name, "holds": first, "indexing": indexing},
                    fix=(f"swap the names the grids are unpacked into (the first one is the {first} "
                         f"coordinate)"))
