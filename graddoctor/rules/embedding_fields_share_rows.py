from __future__ import annotations

from ..findings import Severity
from .base import Rule


def _listed(sizes: list[int], most: int = 6) -> str:
    shown = ", ".join(str(s) for s in sizes[:most])
    return shown + (f" and {len(sizes) - most} more" if len(sizes) > most else "")


class EmbeddingFieldsShareRows(Rule):
    """
    ## What it does
    Finds categorical fields looked up in one shared embedding table without their offsets: a
    `(batch, fields)` batch of label-encoded ids embedded in a table that has as many rows as
    the fields have values together, where every column's ids start at the same place (0) and
    no id above the largest field's is ever looked up. DeepFM, factorization machines, wide &
    deep, AutoInt, a tabular model with one table for every categorical column, a (user, item)
    pair in one id table.

    ## Why is this bad?
    A shared table gives field j the rows after those of the fields before it; the lookup must
    shift each column by that offset (`x + offsets`). Without it, value 3 of the first field
    and value 3 of the second field are one vector, trained by both, and the rows meant for the
    later fields are never looked up. The model cannot tell the fields apart; the loss still
    falls, on what the collided vectors can fit.

    ## Example
    ```python
    self.emb = nn.Embedding(sum(field_dims), k)
    ...
    e = self.emb(x)                      # x: (B, F), each column from 0
    ```

    ## Use instead
    ```python
    self.offsets = torch.tensor((0, *np.cumsum(field_dims)[:-1]))
    ...
    e = self.emb(x + self.offsets)       # field j's ids after the fields before it
    ```

    Or give each field a table of its own (`nn.ModuleList` of `nn.Embedding`).

    ## Stays silent on
    Fields with their offsets (the columns lie one after the other, a shared padding row 0
    included); token or item sequences and bags of tags (each column spans the vocabulary, so
    the columns' sizes add up to several tables); fields hashed into one table of buckets; a
    table far larger than the fields together. Not judged: one-dimensional lookups (one field
    per call), batches with fewer rows than columns, tables that do not train, GPU indices after
    the first optimizer step.
    """

    code = "GD268"
    slug = "embedding-fields-share-rows"
    severity = Severity.WARNING
    summary = ("categorical fields are looked up in one embedding table without their offsets: "
               "every field's ids start at 0, so the fields share the table's first rows")
    fix = "add each field's offset to its ids before the lookup (x + offsets), or give each field a table"

    def check(self, a):
        for e in a.of_kind("field_rows"):
            rows, fields, sizes, top = e["rows"], e["fields"], e["sizes"], e["top"]
            what = (f"this {e['api']} looks up {fields} columns of ids in one table of {rows} "
                    f"rows, and every column starts at the same id: their sizes ({_listed(sizes)}) "
                    f"add up to {e['covered']}, about the table's rows, yet no id above {top - 1} "
                    f"was looked up in {e['calls']} calls. The fields share the table's first "
                    f"rows (value 1 of every field is one vector) and the last {rows - top} rows "
                    "are never trained: the per-field offsets were not added")
            fix = ("shift each column by the values of the fields before it before the lookup, "
                   "e.g. `offsets = torch.tensor((0, *np.cumsum(field_dims)[:-1]))` and "
                   "`emb(x + offsets)`, or give each field its own nn.Embedding")
            yield self.finding(
                what, e.loc, fix=fix,
                evidence={"api": e["api"], "rows": rows, "fields": fields, "sizes": sizes,
                          "covered": e["covered"], "top": top, "calls": e["calls"]})
