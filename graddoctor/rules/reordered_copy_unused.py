from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_REORDERS = ("gather", "take_along_dim", "index_select")


def _source_of(value: ast.AST, loop_names: set[str]) -> tuple[str, str] | None:
    """``(tensor name, index text)`` when ``value`` reorders a named tensor by an index tensor:
    ``torch.gather(gt, 1, idx)``, ``gt.gather(1, idx)``, ``index_select``, ``gt[b][col]``,
    ``gt[perm]`` (an index that is a name other than a loop's variable, or built from one)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in _REORDERS:
        owner = value.func.value
        if isinstance(owner, ast.Name) and owner.id == "torch" and value.args \
                and isinstance(value.args[0], ast.Name):
            return value.args[0].id, ast.unparse(value.args[-1])
        if isinstance(owner, ast.Name) and owner.id != "torch" and value.args:
            return owner.id, ast.unparse(value.args[-1])
        return None
    if isinstance(value, ast.Subscript):
        base = value.value
        while isinstance(base, ast.Subscript):
            base = base.value
        index = value.slice
        names = {n.id for n in walk(index) if isinstance(n, ast.Name)}
        if isinstance(base, ast.Name) and names and not names <= loop_names:
            return base.id, ast.unparse(index)
    return None


def unused_reorders(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``(line of the unused copy, its name, the tensor it reorders, line of that tensor's next
    read)``: in one function, a name assigned a reordered copy of a tensor (a matching's
    ``gather``, a permutation's index) that nothing reads afterwards, while the function reads
    the original tensor after it (in a return or an assignment): the original was used where
    the aligned copy was meant."""
    out = []
    for function in walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inner = {id(n) for f in walk(function) if f is not function
                 and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
                 for n in walk(f)}
        nodes = [n for n in walk(function) if id(n) not in inner]
        loops = {t.id for n in nodes if isinstance(n, (ast.For, ast.comprehension))
                 for t in walk(n.target) if isinstance(t, ast.Name)}
        loads = [n for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        for n in nodes:
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name)) or n.targets[0].id.startswith("_"):
                continue
            name = n.targets[0].id
            found = _source_of(n.value, loops)
            if found is None or found[0] == name:
                continue
            original = found[0]
            if any(l.id == name for l in loads if (l.lineno, l.col_offset) > (n.lineno, n.col_offset)
                   or l.lineno < n.lineno):
                continue  # read somewhere (a later statement, or a loop's earlier line)
            later = sorted(l.lineno for l in loads if l.id == original and l.lineno > n.lineno)
            if not later:
                continue
            out.append((n.lineno, name, original, later[0]))
    return out


class ReorderedCopyUnused(Rule):
    """
    ## What it does
    Finds, in a function of the script whose backwards ran, a tensor reordered by an index —
    a matching's assignment (`torch.gather(gt, 1, col)`, `gt[b][col]`), a permutation
    (`labels[perm]`), an `index_select` — assigned to a name that nothing reads afterwards,
    while the function goes on reading the original tensor: the loss compares against the
    unaligned original where the aligned copy was meant. Reported at the first read of the
    original after the copy, with the copy as related.

    ## Why is this bad?
    Set losses (EMD, Hungarian-matched boxes or masks), shuffled pairs and sorted batches all
    compute an alignment first and then must use the aligned copy. Refactored or mistyped so
    the loss reads the original, the prediction is compared with targets in arbitrary order:
    the matching runs every step and changes nothing, the model learns the average target.
    Nothing fails; the loss falls a little and stalls.

    ## Example
    ```python
    col = emd_match(pred, gt)
    matched = torch.gather(gt, 1, col.unsqueeze(-1).expand(-1, -1, 3))
    return (pred - gt).norm(dim=-1).mean()
    ```

    ## Use instead
    ```python
    return (pred - matched).norm(dim=-1).mean()
    ```

    ## Stays silent on
    A copy read anywhere after (a loss, a log, a return); names starting with `_`; indexing by
    a loop's own variable (`gt[b]` in `for b in ...`: a per-sample slice, not a reorder);
    constant indices (`x[0]`, `out[:, -1]`); a function that does not read the original after
    the copy.
    """

    code = "GD375"
    slug = "reordered-copy-unused"
    severity = Severity.WARNING
    summary = ("a tensor reordered by an index (a matching, a permutation) is assigned and never "
               "read, while the original is used after it")
    fix = "use the reordered copy where the original is read"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, original, read in unused_reorders(tree):
                yield self.finding(
                    f"`{name}` (line {line}) is `{original}` reordered by an index, and nothing "
                    f"reads it; this line reads `{original}` itself: the alignment is computed "
                    f"and dropped, so this compares against `{original}` in its original order",
                    Location(path, read),
                    related=(Related(Location(path, line), f"`{name}`, the reordered copy"),),
                    fix=f"read `{name}` here instead of `{original}` (or drop the unused copy)",
                    evidence={"copy": name, "original": original, "copy_line": line})
