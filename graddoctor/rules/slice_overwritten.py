from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk


def _base_name(target: ast.AST) -> str | None:
    """``out_ft`` of ``out_ft[:, :, :m1, :m2]``, ``self.buf`` of ``self.buf[0]``."""
    node = target
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return ast.unparse(node)
    return None


def _mentions(node: ast.AST, base: str) -> bool:
    root = base.split(".")[0]
    return any(isinstance(n, ast.Name) and n.id == root for n in walk(node))


def overwritten_slices(tree: ast.AST) -> list[tuple[int, str, int]]:
    """``(line, target, first_line)``: a subscript assignment whose exact target (same text, a
    slice or an index, not a name that changes in between) the same block assigned before,
    nothing between the two reading or changing the tensor, the value of the second not
    reading it either: the first write is lost before anything used it."""
    found = []
    for block_owner in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(block_owner, field, None)
            if not isinstance(block, list):
                continue
            # target text -> (line, base, the names its index reads)
            last: dict[str, tuple[int, str, set[str]]] = {}
            for stmt in block:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                        and isinstance(stmt.targets[0], ast.Subscript):
                    target = stmt.targets[0]
                    text = ast.unparse(target)
                    base = _base_name(target)
                    if base is not None and text in last and not _mentions(stmt.value, base):
                        found.append((stmt.lineno, text, last[text][0]))
                    # whatever this statement reads or writes ends the pending writes it touches
                    for key in [k for k, (_, b, _) in last.items()
                                if _mentions(stmt.value, b) or _mentions(target.slice, b)]:
                        del last[key]
                    if base is not None:
                        last[text] = (stmt.lineno, base, {n.id for n in walk(target.slice)
                                                          if isinstance(n, ast.Name)})
                    continue
                # any other statement: forget the writes of every tensor it mentions, and those
                # whose index it moves (``k += 1`` between ``out[k] = a`` and ``out[k] = b``)
                stored = _stored_names(stmt)
                for key in [k for k, (_, b, index) in last.items() if _mentions(stmt, b)
                            or stored & index]:
                    del last[key]
                if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr,
                                         ast.Pass)):
                    last.clear()  # control flow: the two writes may not both run
                elif _has_call(stmt):
                    last.clear()  # a call may read the tensor through a view or an alias
    return sorted(set(found))


def _has_call(stmt: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in walk(stmt))


def _stored_names(stmt: ast.AST) -> set[str]:
    """Names a statement assigns as a whole."""
    return {n.id for n in walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class SliceOverwritten(Rule):
    """
    ## What it does
    Finds a slice (or an index) of a tensor assigned twice in a row with the same target text,
    nothing in between reading the tensor: a Fourier layer that writes its negative-frequency
    product into the positive modes' slot (`out_ft[:, :, :m1, :m2] = ...` twice, the second
    meant for `-m1:`), a stencil or a boundary row written to the same place twice, the second
    value copied from the first and edited everywhere but its target. Read from the source of
    the files a backward ran from.

    ## Why is this bad?
    The first value is thrown away before anything uses it, and the slot the second was meant
    for keeps its zeros. Nothing fails: the layer keeps half of its modes, the parameters that
    made the first value get an exactly zero gradient and never train, and the model is
    quietly weaker.

    ## Example
    ```python
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], self.w1)
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m1:, :m2], self.w2)
    ```

    ## Use instead
    ```python
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], self.w1)
    out_ft[:, :, -m1:, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m1:, :m2], self.w2)
    ```

    ## Stays silent on
    Writes to different slices; a second write whose value reads the tensor (an update of the
    slot: `x[0] = x[0] * 2`); a statement between them that mentions the tensor or calls
    anything (it may read the first value through a view); writes under different branches of
    an `if`, or indexed by a name the block changes; files no backward ran from.
    """

    code = "GD393"
    slug = "slice-overwritten"
    severity = Severity.WARNING
    summary = ("a tensor slice is assigned twice in a row with nothing reading it in between: "
               "the first value is lost (its parameters get no gradient) and the slot meant "
               "for the second keeps its zeros")
    fix = "write the second value to the slice it was meant for (`-m1:` for negative modes)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, target, first in overwritten_slices(tree):
                yield self.finding(
                    f"`{target}` is assigned here and at line {first}, with nothing reading it "
                    f"in between: the value written at line {first} is lost before anything uses "
                    f"it (what made it gets an exactly zero gradient), and the slot this "
                    f"statement was meant for keeps what it held",
                    Location(path, line),
                    related=(Related(Location(path, first), "the write this one overwrites"),),
                    evidence={"target": target, "first_line": first},
                    fix=("write this value to the slice it was meant for (a copied line whose "
                         "target was not edited: the negative modes' `-m1:`, the other "
                         "boundary), or drop the first write"))
