from __future__ import annotations

from ..analysis.mask_polarity import mixed_polarity_fills
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class MaskFilledBothWays(Rule):
    """
    ## What it does
    Finds one padding mask given to `masked_fill` with a large negative value (`-inf`, `-1e9`,
    `torch.finfo(...).min`: "leave these positions out of the softmax, the max, the sort") as it
    is at one call and complemented (`~mask`, `mask == 0`, `logical_not`) at another. One of the
    two leaves out the real positions and keeps the padding. Which one is read from the mask's
    name: a mask named for the padding (`pad_mask`, `padding`, `invalid`) is True there and is
    given as it is; any other (`mask`, `valid`, `ctx_mask`, `m`) is True at the real positions
    and is complemented. It points at the call written the other way. Read from the source of
    the files whose backwards ran.

    ## Why is this bad?
    A fill of `-inf` takes positions out of a softmax, a `max` or a sort. Given the mask the
    wrong way round it takes out every real position instead: a span head's start scores can
    only pick question or padding tokens, a ranking's sort puts the padding first and the
    listwise weights of the real items come from the padding's ranks, a pooled maximum reads
    only the padding. The shapes agree and the loss still falls, on the wrong positions.

    ## Example
    ```python
    start_logits = start_logits.masked_fill(ctx_mask, -1e4)    # ctx_mask is True in the context
    end_logits = end_logits.masked_fill(~ctx_mask, -1e4)
    ```

    ## Use instead
    ```python
    start_logits = start_logits.masked_fill(~ctx_mask, -1e4)
    end_logits = end_logits.masked_fill(~ctx_mask, -1e4)
    ```

    ## Stays silent on
    A mask given the same way at every fill; fills of 0 or of another finite value (a mask
    zeroing features, a label filled with `-100`); masks of pairs or classes whose complement is
    another set on purpose (`pos_mask` and `~pos_mask` for the positives' and the negatives'
    scores, `causal`, `diag`, `eye`, `labels`); a mask written inline as a comparison.
    """

    code = "GD432"
    slug = "mask-filled-both-ways"
    severity = Severity.WARNING
    summary = ("one padding mask is given to masked_fill(-inf) as it is at one call and "
               "complemented at another: one of them leaves out the real positions and keeps "
               "the padding")
    fix = "give the mask the same way at every fill that leaves out the padding"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for found in mixed_polarity_fills(a.source.full(path)):
                name, text, other = found["name"], found["text"], found["other_text"]
                if found["complemented"]:
                    how = (f"complements `{name}`, whose name says it is True at the padding, "
                           f"while `{other}` gives it as it is")
                    fixed = text.replace(f"~{name}", name, 1)
                else:
                    how = (f"gives `{name}` as it is, while `{other}` complements it: `{name}` is "
                           f"True at the real positions, so this fill leaves them out and keeps "
                           f"the padding")
                    fixed = text.replace(f"({name}", f"(~{name}", 1)
                yield self.finding(
                    f"`{text}` {how}", Location(path, found["line"], None),
                    related=(Related(Location(path, found["other_line"], None),
                                     f"the fill that gives `{name}` the other way"),),
                    fix=(f"fill the padding: `{fixed}`" if fixed != text else self.fix),
                    evidence={"mask": name, "complemented": found["complemented"],
                              "other_line": found["other_line"]})
