from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

_JUDGED = 2  # backwards that must each show the draw short of the data's rows
_BEYOND = 0.05  # share of the data's indices into the table past the draw's bound, at least
_DATA = 8  # data indices counted, at least


class NegativesDrawnOutOfRange(Rule):
    """
    ## What it does
    Finds negatives drawn over the size of another embedding table than the one they index:
    `torch.randint(0, n_relations, ...)` for the corrupted entities of a TransE triple,
    `randint(0, n_users, ...)` for BPR's sampled items. The script's random integer draws are
    remembered for the first backwards with the bound they were asked for (`randint`'s
    `high`, `randperm`'s `n`); a drawn `nn.Embedding` lookup (as `sampled-negatives-pushed-up`
    finds them) whose draw's bound is below the table's rows, equal to the rows of another
    embedding table the same loss looks up, while the data's own indices into the table (the
    positions of a corrupted batch the draw did not replace, the table's undrawn lookups) reach
    the bound or above (5% of them at least), at every one of the judged backwards (two at
    least), is reported at the draw's line.

    ## Why is this bad?
    The negatives are then always among the table's first rows: every other row the data uses
    is never contrasted with anything, so the loss falls quickly (the few drawn rows are easy to
    push away) while the embeddings of most entities or items learn nothing that ranks them
    against wrong candidates, and link prediction or recommendation stays near random. Nothing
    fails: the indices are all valid rows.

    ## Example
    ```python
    rand_e = torch.randint(0, n_rel, h.shape)       # the relation table's size
    h_neg = torch.where(corrupt_head, rand_e, h)    # indexes the entity table
    ```

    ## Use instead
    ```python
    rand_e = torch.randint(0, n_ent, h.shape)
    ```

    ## Stays silent on
    Negatives drawn over the whole table, a draw over a bound no other table of the loss has
    (a deliberate sub-range: the items a catalogue can recommend), a draw that only reaches the
    rows the data uses too, a table shared by two kinds of rows with the draw shifted past the
    first kind (`randint(0, n_items) + n_users`: no lookup reads the draw itself). Not judged:
    draws made with `multinomial`, numpy's `choice` or a `Generator`, scores computed on an
    accelerator, a loss with fewer than two scores of looked-up rows.
    """

    code = "GD430"
    slug = "negatives-drawn-out-of-range"
    severity = Severity.WARNING
    summary = ("negatives are drawn over another embedding table's size than the table they index: "
               "most rows the data uses are never drawn as negatives")
    fix = "draw the negatives over all the rows of the table they index"

    def check(self, a):
        judged: dict = {}  # (path, line) of the draw -> {backward's seq: [(short, range record)]}
        for event in a.of_kind("sampled_scores"):
            for rng in event.get("ranges") or ():
                loc = rng.get("loc")
                if not loc:
                    continue
                short = (rng["high"] in (rng.get("others") or ()) and rng["data"] >= _DATA
                         and rng["beyond"] >= _BEYOND)
                judged.setdefault((loc[0], loc[1]), {}).setdefault(event.seq, []).append((short, rng))
        for (path, line), by_backward in sorted(judged.items()):
            seen = [any(short for short, _ in found) for found in by_backward.values()]
            if len(seen) < _JUDGED or not all(seen):
                continue
            rng = max((r for found in by_backward.values() for short, r in found if short),
                      key=lambda r: r["beyond"])
            text = a.source.line_text(path, line).split("  #")[0].strip()
            said = f"`{text}`" if text else f"the `{rng['fn']}` draw"
            message = (f"{said} draws the negatives in [0, {rng['high']}), the size of another "
                       f"embedding table the loss looks up, but they index a table of "
                       f"{rng['rows']} rows, and {rng['beyond']:.0%} of the data's indices into it "
                       f"are {rng['high']} or above (at each of the first {len(seen)} backwards): "
                       f"rows {rng['high']}..{rng['rows'] - 1} are never drawn as negatives, so "
                       f"most embeddings are never ranked against a wrong candidate while the loss "
                       f"falls")
            fix = (f"draw over the {rng['rows']} rows of the table the negatives index (its "
                   f"`num_embeddings`), not over {rng['high']}")
            yield self.finding(message, Location(path, line), fix=fix, evidence={
                "high": rng["high"], "rows": rng["rows"], "others": rng.get("others"),
                "beyond": rng["beyond"], "backwards": len(seen)})
