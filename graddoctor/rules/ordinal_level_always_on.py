from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

_BCE = ("binary_cross_entropy_with_logits", "binary_cross_entropy", "BCEWithLogitsLoss", "BCELoss")


def _second_argument(tree, line: int) -> str | None:
    """The name given second to the one call on ``line`` with two positional arguments or
    more (a criterion object's ``criterion(logits, targets)``), else None."""
    if tree is None:
        return None
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and n.lineno == line
             and len(n.args) >= 2 and isinstance(n.args[1], ast.Name)]
    return calls[0].args[1].id if len(calls) == 1 else None


class OrdinalLevelAlwaysOn(Rule):
    """
    ## What it does
    Finds an ordinal regression (CORAL, CORN, cumulative-link) trained with binary
    cross-entropies on level targets whose first level is positive for every sample: the
    targets of a `binary_cross_entropy_with_logits` (or `binary_cross_entropy`) are 0/1, each
    row's ones a prefix of its columns (the encoding `levels[i, k] = y_i > k`), and in the first
    calls (256 rows or more, over two calls or more) the first column is 1 in every row while a later one varies. That is
    `y[:, None] >= torch.arange(K - 1)` (or `> torch.arange(-1, ...)`) where `>` from 0 was
    meant: every threshold is shifted one rank down. It points at the statement that builds the
    target the loss is given, when the script assigns it to a name, else at the loss call.

    ## Why is this bad?
    With K ranks there are K - 1 thresholds, level k answering "is the rank above k". Shifted
    by one, the first level is "rank at least 0", true for everyone: its logit is pushed to
    infinity and learns nothing, while the real first boundary (between ranks 0 and 1) is never
    trained, and every other level answers the question of the level below. The predicted rank
    `(sigmoid(logits) > 0.5).sum(1)` comes out one too high for most samples, and the mean
    absolute error roughly doubles. Nothing fails and the loss falls.

    ## Example
    ```python
    levels = (y[:, None] >= torch.arange(K - 1)[None, :]).float()
    loss = F.binary_cross_entropy_with_logits(model(x), levels)
    ```

    ## Use instead
    ```python
    levels = (y[:, None] > torch.arange(K - 1)[None, :]).float()
    ```

    ## Stays silent on
    Correct cumulative encodings (`y > k`, `k < y`, a lookup table of prefix rows), whose first
    level is 0 for the samples of the lowest rank; a batch without the lowest rank in some calls
    but with it in others; multi-label targets that are not prefixes (any label set); soft or
    smoothed level targets; a first column all 1 when no other column varies (nothing to tell
    apart).
    """

    code = "GD358"
    slug = "ordinal-level-always-on"
    severity = Severity.WARNING
    summary = ("an ordinal regression's first level target is 1 for every sample: the level "
               "targets are built with >= where > was meant, one rank off")
    fix = "build the levels as `y[:, None] > torch.arange(K - 1)`: level k is 'rank above k'"

    def check(self, a):
        for e in a.of_kind("ordinal_shifted"):
            loc, notes, text = e.loc, (), None
            if e.loc is not None:
                name = None
                for fn in _BCE:
                    name = a.source.call_argument(e.loc.path, e.loc.line, fn, 1, "target")
                    if name:
                        break
                if not name:
                    name = _second_argument(a.source.tree(e.loc.path), e.loc.line)
                origin = (a.source.value_origin(e.loc.path, e.loc.line, name)
                          if name and name.isidentifier() else None)
                if origin is not None and origin[0] != e.loc.line:
                    loc = Location(e.loc.path, origin[0], e.loc.function)
                    text = origin[1]
                    notes = (related(e, "the binary cross-entropy given those level targets"),)
            shown = f"`{text}`" if text else "the level targets"
            fixed = text.replace(">=", ">", 1) if text and ">=" in text else None
            yield self.finding(
                f"{shown} makes cumulative level targets whose first level is 1 for all "
                f"{e['rows']} samples read ({e['levels']} levels): the first threshold means "
                f"'rank at least 0', true for everyone, so every level is shifted one rank down, "
                f"the boundary between the two lowest ranks is never trained and the predicted "
                f"rank comes out one too high",
                loc, related=notes, step=a.next_step_number(e.seq),
                evidence={"fn": e["fn"], "levels": e["levels"], "rows": e["rows"]},
                fix=(f"`{fixed}`: level k is 'rank above k'" if fixed else None))
