from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from ..analysis.source import scope_walk as _scope_walk
from .base import Related, Rule
from ..analysis.source import walk

# a derivative named by its directions after the function's name: u_x, u_xx, u_xt, p_y
_NAMED = re.compile(r"^([A-Za-z][A-Za-z0-9]*)_([a-z]+)$")
_STACKS = ("cat", "stack", "hstack", "column_stack", "concat", "concatenate")


def _is_grad(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "grad" and len(node.args) >= 2


def _column(index: ast.AST) -> int | None:
    """The one column an index reads along the last axis of a (points, coordinates) tensor:
    ``[:, k]``, ``[:, k:k + 1]``, ``[..., k]``, ``[:, [k]]``; None for anything else."""
    if not isinstance(index, ast.Tuple) or len(index.elts) != 2:
        return None
    first, last = index.elts
    if not (isinstance(first, ast.Slice) and first.lower is None and first.upper is None
            or isinstance(first, ast.Constant) and first.value is Ellipsis):
        return None
    if isinstance(last, ast.Constant) and isinstance(last.value, int):
        return last.value
    if isinstance(last, ast.List) and len(last.elts) == 1 and isinstance(last.elts[0], ast.Constant):
        return last.elts[0].value if isinstance(last.elts[0].value, int) else None
    if isinstance(last, ast.Slice) and last.step is None and isinstance(last.lower, ast.Constant) \
            and isinstance(last.upper, ast.Constant) and isinstance(last.lower.value, int) \
            and isinstance(last.upper.value, int) and last.upper.value == last.lower.value + 1:
        return last.lower.value
    return None


def _pairs(stmt: ast.Assign):
    """(target name, value) of a one-name assignment or of each element of a tuple assignment
    of a tuple (``u_x, u_t = du[:, 0:1], du[:, 1:2]``)."""
    if len(stmt.targets) != 1:
        return []
    target = stmt.targets[0]
    if isinstance(target, ast.Name):
        return [(target.id, stmt.value)]
    if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
            and len(target.elts) == len(stmt.value.elts):
        return [(t.id, v) for t, v in zip(target.elts, stmt.value.elts) if isinstance(t, ast.Name)]
    return []


def _coordinates(value: ast.AST) -> list[str] | None:
    """The one-letter names a tensor of coordinates is stacked from, in column order
    (``torch.cat([x, t], 1)``), or None."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr not in _STACKS and isinstance(value.func.value, ast.Call):
        value = value.func.value  # torch.cat([x, t], 1).requires_grad_(True)
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in _STACKS or not value.args or not isinstance(value.args[0], (ast.List, ast.Tuple)):
        return None
    letters = []
    for elt in value.args[0].elts:
        while isinstance(elt, ast.Call) and isinstance(elt.func, ast.Attribute):
            elt = elt.func.value  # x.requires_grad_(), t.view(-1, 1)
        if not (isinstance(elt, ast.Name) and len(elt.id) == 1 and elt.id.islower()):
            return None
        letters.append(elt.id)
    return letters if len(set(letters)) == len(letters) >= 2 else None


def mislabelled_derivatives(tree: ast.AST) -> list[tuple[int, str, str, int, str, str]]:
    """``[(line, the derivative's name, the direction its name says, the column it reads, the
    coordinate of that column, how the columns are known)]`` for each derivative of a function
    taken by ``autograd.grad`` whose name's last direction (``u_xx``: x) is not the coordinate
    of the column it reads, where the columns' coordinates are known from the inputs' stacking
    (``xt = torch.cat([x, t], 1)``) or, failing that, agreed by the other named columns of the
    same gradient (``u_x, u_t = du[:, 0:1], du[:, 1:2]``)."""
    found = []
    scopes = [tree, *(n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        assigns = [n for n in _scope_walk(scope) if isinstance(n, ast.Assign)]
        stacked: dict[str, list[str]] = {}
        grads: dict[str, tuple[str, str]] = {}  # name holding a whole gradient -> (output, input)
        reads = []  # (line, name, output, input, column)
        for stmt in sorted(assigns, key=lambda n: n.lineno):
            for name, value in _pairs(stmt):
                letters = _coordinates(value)
                if letters:
                    stacked[name] = letters
                    continue
                inner, column = value, None
                if isinstance(value, ast.Subscript):
                    column = _column(value.slice)
                    if column is not None:
                        inner = value.value
                if isinstance(inner, ast.Subscript) and isinstance(inner.slice, ast.Constant) \
                        and inner.slice.value == 0 and _is_grad(inner.value):
                    call = inner.value
                    out, inp = call.args[0], call.args[1]
                    if not (isinstance(out, ast.Name) and isinstance(inp, ast.Name)):
                        continue
                    if column is None and value is inner:
                        grads[name] = (out.id, inp.id)
                    elif column is not None:
                        reads.append((stmt.lineno, name, out.id, inp.id, column))
                elif column is not None and isinstance(inner, ast.Name) and inner.id in grads:
                    out, inp = grads[inner.id]
                    reads.append((stmt.lineno, name, out, inp, column))
        found.extend(_judge(reads, stacked))
    return sorted(found)


def _direction(name: str, out: str) -> str | None:
    """The direction a derivative's name adds to its function's (``u_xt`` of ``u_x``: t)."""
    m = _NAMED.match(name)
    if not m:
        return None
    base, dirs = m.groups()
    o = _NAMED.match(out)
    out_base, out_dirs = (o.groups() if o else (out, ""))
    if base != out_base or len(dirs) != len(out_dirs) + 1 or not dirs.startswith(out_dirs):
        return None
    return dirs[-1]


def _judge(reads, stacked):
    # the first derivatives' names give each coordinate's column, when they agree one to one
    named: dict[str, dict[str, set[int]]] = {}
    for _, name, out, inp, column in reads:
        d = _direction(name, out)
        if d is not None and not _NAMED.match(out):
            named.setdefault(inp, {}).setdefault(d, set()).add(column)
    for line, name, out, inp, column in reads:
        d = _direction(name, out)
        if d is None:
            continue
        if inp in stacked:
            letters = stacked[inp]
            if d in letters and column < len(letters) and letters[column] != d:
                yield line, name, d, column, letters[column], "stacked"
            continue
        if not _NAMED.match(out):
            continue  # a first derivative is what the map is made of
        columns = named.get(inp, {})
        if any(len(cs) != 1 for cs in columns.values()) or \
                len({c for cs in columns.values() for c in cs}) != len(columns):
            continue  # the names do not agree on one column each
        owner = {next(iter(cs)): dd for dd, cs in columns.items()}
        if d in columns and column not in columns[d] and column in owner:
            yield line, name, d, column, owner[column], "named"


class DerivativeAxisMismatch(Rule):
    """
    ## What it does
    Finds a derivative taken with `torch.autograd.grad` (a physics-informed network's `u_x`,
    `u_xx`, `u_t`) whose name says one coordinate but which reads the column of another: the
    coordinates' columns known from how the inputs are stacked (`xt = torch.cat([x, t], 1)`),
    or from the other derivatives of the same gradient (`u_x, u_t = du[:, 0:1], du[:, 1:2]`,
    then `u_xx = grad(u_x, xt, ...)[0][:, 1:2]` reads `t`'s column). Read from the script's
    source, in the files a backward ran from; it points at the mislabelled derivative.

    ## Why is this bad?
    The residual of the equation is then built from another derivative than it says (`u_xt`
    for `u_xx`, `u_x` for `u_t`): the network is trained to satisfy a different equation. The
    loss falls as well as before, and the solution is wrong everywhere away from the boundary
    and initial data.

    ## Example
    ```python
    du = torch.autograd.grad(u, xt, torch.ones_like(u), create_graph=True)[0]
    u_x, u_t = du[:, 0:1], du[:, 1:2]
    u_xx = torch.autograd.grad(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, 1:2]
    ```

    ## Use instead
    ```python
    du = torch.autograd.grad(u, xt, torch.ones_like(u), create_graph=True)[0]
    u_x, u_t = du[:, 0:1], du[:, 1:2]
    u_xx = torch.autograd.grad(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, 0:1]
    ```

    ## Stays silent on
    Inputs ordered `(t, x)` and read so (`u_t = du[:, 0:1]`); mixed derivatives named for both
    directions (`u_xt`); derivatives taken with respect to separate tensors (`grad(u, x)`);
    names that do not spell directions after the function's name (`dudx`, `grad_u`); columns
    chosen by a variable; inputs stacked from expressions rather than one-letter names, with no
    other derivative to agree with.
    """

    code = "GD345"
    slug = "derivative-axis-mismatch"
    severity = Severity.WARNING
    summary = ("a derivative from torch.autograd.grad is named for one coordinate (u_xx) but reads "
               "another coordinate's column: the equation's residual is built from the wrong "
               "derivative")
    fix = "read the column of the coordinate the derivative is named for"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, says, column, holds, known in mislabelled_derivatives(tree):
                how = ("the inputs are stacked with `" + holds + "` in that column" if known == "stacked"
                       else f"the other derivatives of the same gradient read `{holds}` there")
                yield self.finding(
                    f"`{name}` is named as a derivative along `{says}` but reads column {column}, "
                    f"which holds `{holds}` ({how}): the residual built from it uses the "
                    f"derivative along `{holds}`, so the network is trained on a different "
                    f"equation than the one written",
                    Location(path, line),
                    evidence={"name": name, "named": says, "column": column, "holds": holds,
                              "known_from": known},
                    fix=f"read the column of `{says}` in this gradient, not column {column}")
