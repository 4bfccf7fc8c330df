from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _last_two_names(node: ast.Subscript) -> tuple[str, str] | None:
    index = node.slice
    if not isinstance(index, ast.Tuple) or len(index.elts) < 3:
        return None
    a, b = index.elts[-2], index.elts[-1]
    if isinstance(a, ast.Name) and isinstance(b, ast.Name) and a.id != b.id:
        return a.id, b.id
    return None


def swapped_subscripts(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of the subscripts read (not assigned) whose last two indices are two names
    that another subscript of the script gives in the other order (``reg[b, :, gx, gy]`` beside
    ``obj[b, gy, gx] = 1``)."""
    subscripts = [n for n in walk(tree) if isinstance(n, ast.Subscript)]
    pairs = {}
    for node in subscripts:
        names = _last_two_names(node)
        if names is not None:
            pairs.setdefault(names, []).append(node)
    # the order the script writes its targets in (``obj[b, gy, gx] = 1``), where it writes one
    written = {names for names, nodes in pairs.items()
               if any(isinstance(n.ctx, ast.Store) for n in nodes)}
    out = []
    for (a, b), nodes in pairs.items():
        if (b, a) not in pairs or (written and (b, a) not in written):
            continue
        out += [(n.lineno, ast.unparse(n)) for n in nodes if isinstance(n.ctx, ast.Load)]
    return sorted(set(out))


class CellsReadTransposed(Rule):
    """
    ## What it does
    Finds a dense prediction map (a detector's box regression, offsets, sizes) read with index
    tensors at the *mirrored* cells of the positives its own classification target marks:
    `reg_map[b, :, gx, gy]` where the target was built `obj[b, gy, gx] = 1`. Seen in the graph
    of the first 3 backwards: a binary cross-entropy target of shape (N, H, W) (or with a class
    axis) and an advanced indexing of a map with the same batch and last two sizes by three index
    tensors, whose cells are at most half positives but all positives once row and column are
    swapped. Reported at the subscript whose last two index names another subscript of the
    script gives in the other order, else at the backward.

    ## Why is this bad?
    Centre matching ties each object to one cell, and every head must be read at that cell.
    Read at (x, y) instead of (y, x), the regression loss trains the outputs of cells that hold
    no object (on a square grid nothing fails), while the cells the classifier learns to fire at
    never learn a box: the detector finds its objects and draws their boxes from untrained
    outputs.

    ## Example
    ```python
    obj[torch.arange(n), gy, gx] = 1.0
    reg_pos = reg_map[torch.arange(n), :, gx, gy]    # column index as the row
    ```

    ## Use instead
    ```python
    reg_pos = reg_map[torch.arange(n), :, gy, gx]    # (row, column) = (y, x), as the target
    ```

    ## Stays silent on
    A map read at the cells its target marks; a map transposed before it is read
    (`reg.permute(0, 1, 3, 2)[b, :, gx, gy]`, `reg.transpose(2, 3)[...]`); reads through a
    boolean mask (`reg.permute(0, 2, 3, 1)[pos_mask]`); cells on the diagonal only; a map whose
    target is no binary cross-entropy's.
    """

    code = "GD278"
    slug = "cells-read-transposed"
    severity = Severity.WARNING
    summary = ("a dense map is read at the transposed cells of the positives its loss's target "
               "marks: row and column indices swapped")
    fix = "index the map (row, column) as the target was built: reg_map[b, :, gy, gx]"

    def check(self, a):
        for e in a.of_kind("cells_transposed"):
            loc, related, text = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                found = swapped_subscripts(tree) if tree is not None else []
                if len(found) == 1:
                    loc = Location(e.loc.path, found[0][0])
                    text = found[0][1]
                    related = (Related(e.loc, "the backward whose graph holds it"),)
            shape = "×".join(str(s) for s in e["shape"])
            written = f"`{text}`" if text else f"an indexing of a {shape} map"
            yield self.finding(
                f"{written} reads {e['cells']} cells of a {shape} map, {e['inside']} of them "
                f"positives of the binary cross-entropy's target, but every one of them a "
                f"positive once row and column are swapped: the row and column indices are "
                f"swapped, so this term trains cells that hold no object and the positives' "
                f"outputs never learn",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=("swap the last two indices so that they follow the target's (row, column) "
                     "order, e.g. reg_map[b, :, gy, gx] for obj[b, gy, gx]"),
                evidence={"shape": list(e["shape"]), "cells": e["cells"], "inside": e["inside"],
                          "positives": e["positives"]})
