from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_NORMS = ("normalize", "norm", "vector_norm")


def _dim_zero(call: ast.Call, name: str) -> bool:
    """The call normalises (or takes norms) along dim 0: ``dim=0`` / ``axis=0`` given, or
    ``F.normalize``'s third positional argument 0."""
    for kw in call.keywords:
        if kw.arg in ("dim", "axis"):
            return isinstance(kw.value, ast.Constant) and kw.value.value == 0
    if name == "normalize" and len(call.args) >= 3:
        third = call.args[2]
        return isinstance(third, ast.Constant) and third.value == 0
    return False


def normalisations_across_rows(tree) -> list[tuple[int, str]]:
    """``(line, text)`` of each call in the file that normalises a ``.weight`` (or takes its
    norms) along dim 0: ``F.normalize(emb.weight, dim=0)``, ``emb.weight.norm(dim=0)``."""
    found = []
    if tree is None:
        return found
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in _NORMS or not _dim_zero(node, name):
            continue
        subject = node.args[0] if node.args else (func.value if isinstance(func, ast.Attribute) else None)
        if name != "normalize" and isinstance(func, ast.Attribute) and not node.args:
            subject = func.value
        elif name == "norm" and isinstance(func, ast.Attribute) and \
                "weight" in ast.unparse(func.value):
            subject = func.value
        if subject is None or "weight" not in ast.unparse(subject):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


class EmbeddingNormalisedAcrossRows(Rule):
    """
    ## What it does
    Finds an embedding table that the script renormalises after every update along the wrong
    axis: `F.normalize(ent.weight, dim=0)` (or `weight / weight.norm(dim=0)`) for TransE's
    unit-norm entities, which scales each feature over all the entities instead of each
    entity's vector. For the first optimizer steps, every trained CPU table with more rows than
    columns that an embedding lookup reads is measured once per step: reported when at three
    steps or more, and at three quarters of the steps it was read at least (an evaluation may
    read it between a step and the renormalisation), each of its columns has unit norm and not
    each of its rows,
    at the call that normalises a `.weight` along dim 0 when the file has one, else at the
    table's lookup.

    ## Why is this bad?
    The constraint is meant per entity (each row on the unit sphere, so that no entity can
    lower the margin loss by growing its norm). Along dim 0 the rows keep any norm, an entity
    seen often still drifts far while the columns are tied together: every update of one row
    rescales that feature of every other row, so rarely seen entities move with each batch and
    the distances the loss ranks change meaning from step to step. Nothing fails; link
    prediction just stays poor.

    ## Example
    ```python
    with torch.no_grad():
        model.ent.weight.copy_(F.normalize(model.ent.weight, p=2, dim=0))
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        model.ent.weight.copy_(F.normalize(model.ent.weight, p=2, dim=1))  # each entity's row
    ```

    ## Stays silent on
    Rows normalised (`dim=1`, `dim=-1`, `renorm_(2, 0, 1.0)`, which bounds each row),
    `nn.Embedding(max_norm=1)`, a table normalised only once at initialisation, a square table,
    a table whose rows and columns both have unit norm, a table whose columns are kept
    orthonormal (a QR retraction onto the Stiefel manifold). Not judged: a normalised copy used in the
    forward without writing it back (`F.normalize(weight, dim=0)[ids]`: no lookup reads the
    table), tables on an accelerator or of more than 4M values.
    """

    code = "GD431"
    slug = "embedding-normalised-across-rows"
    severity = Severity.WARNING
    summary = ("an embedding table is renormalised after each update along dim 0: each feature over "
               "all the rows, not each row to unit norm")
    fix = "normalise each row of the table: `dim=1` (or `dim=-1`)"

    def check(self, a):
        told = set()
        for event in a.of_kind("table_columns_unit"):
            if event.loc is None:
                continue
            path = event.loc.path
            calls = normalisations_across_rows(a.source.tree(path))
            if calls:
                line, text = calls[0]
                where = f"`{text}`"
                fix = f"normalise each row: `{text.replace('dim=0', 'dim=1')}`" \
                    if "dim=0" in text else self.fix
            else:
                line, where, fix = event.loc.line, "the script", self.fix
            if (path, line) in told:
                continue
            told.add((path, line))
            yield self.finding(
                f"after {event['steps']} of the first {event['read']} updates each of the "
                f"{event['cols']} columns of this {event['rows']}x{event['cols']} embedding table "
                f"has unit norm, and its rows do not: {where} normalises each feature over all "
                f"{event['rows']} rows instead of each row, so the per-entity norm constraint "
                f"never holds and every update rescales the other rows",
                Location(path, line), fix=fix,
                evidence={"rows": event["rows"], "cols": event["cols"], "steps": event["steps"],
                          "read": event.get("read"),
                          "api": event["api"]})
