from __future__ import annotations

from ..analysis.group_broadcast import misaligned_group_expansions
from ..findings import Severity
from ..trace import Location
from .base import Rule


class GroupBaselineMisaligned(Rule):
    """
    ## What it does
    Finds a per-group statistic of a flat batch expanded back to one value per element in the
    layout of the other axis: GRPO's or RLOO's group baseline `rewards.view(-1, G).mean(dim=1)`
    tiled with `.repeat(G)`, or a per-column statistic `rewards.view(-1, G).mean(dim=0)` repeated
    in place with `.repeat_interleave(G)`, then subtracted from (or dividing) the same flat
    tensor. Read from the script's source, in the files whose backwards ran: a two-dimensional
    `view`/`reshape` of a flat tensor (inline or through the name it is assigned to), a
    reduction over one of its axes (`mean`, `std`, `sum`, `max`...), a one-dimensional
    `repeat`/`repeat_interleave` of the result (through names too), and a subtraction or
    quotient of the expanded value and the flat tensor in the same function. It points at the
    expansion.

    ## Why is this bad?
    A view is row-major: element `i` of the flat batch sits in row `i // cols`, column
    `i % cols`. A statistic per row lines up with the elements when each value is repeated in
    place (`repeat_interleave`); a statistic per column lines up when the vector is tiled
    (`repeat`). The other expansion gives each completion the mean (and scale) of another
    prompt's group, or of a slice across prompts: the advantages no longer sum to zero within
    a group, an easy prompt's completions are all rewarded and a hard one's all punished, and
    the policy learns the prompt's difficulty instead of which completion was better. The
    shapes match whenever the sizes allow it, so nothing fails.

    ## Example
    ```python
    grouped = rewards.view(-1, num_generations)        # completions of a prompt side by side
    mean = grouped.mean(dim=1).repeat(num_generations)
    advantages = rewards - mean
    ```

    ## Use instead
    ```python
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    advantages = rewards - mean
    ```

    ## Stays silent on
    The matching pairs: a row statistic (`dim=1`, `dim=-1`) with `repeat_interleave`, a column
    statistic (`dim=0`) of a prompt-major layout (`prompts.repeat(G, 1)`, `view(G, -1)`) with
    `repeat`; `keepdim=True` statistics broadcast back (`rewards.view(-1, G) - mean`), which line
    up by construction; an expansion that never meets the flat tensor it was computed from. Not
    seen: a view of more than two axes, a statistic computed in another function than the one
    subtracting it, a layout read from a tensor's shape at run time.
    """

    code = "GD166"
    slug = "group-baseline-misaligned"
    severity = Severity.WARNING
    summary = ("a per-group statistic of a flat batch is expanded back in the other axis's "
               "layout: each element gets another group's baseline")
    fix = ("expand a per-row statistic (dim=1) with repeat_interleave and a per-column one (dim=0) "
           "with repeat, or keep the dim (keepdim=True) and subtract on the grouped view")

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, flat, reduced_at, axis, expansion in misaligned_group_expansions(a.source.full(path)):
                per = "row" if axis == "rows" else "column"
                other = "repeat_interleave" if axis == "rows" else "repeat"
                where = f" (line {reduced_at})" if reduced_at != line else ""
                what = (f"a statistic per {per} of a two-dimensional view of `{flat}`{where} is "
                        f"expanded back with `{expansion}`, which lines up with the other axis: "
                        f"element i of `{flat}` sits in row i // cols and column i % cols, so each "
                        f"element is compared with another group's statistic and the group-relative "
                        f"advantages no longer rank completions within their own group")
                if axis == "rows":
                    fix = f"expand the per-row statistic with `repeat_interleave`, not `{expansion}`"
                else:
                    fix = (f"reduce over the group axis (dim=1 for `view(-1, G)`) and expand with "
                           f"`repeat_interleave`, or tile the per-column statistic with `{other}`")
                yield self.finding(what, Location(path, line, None), fix=fix,
                                   evidence={"flat": flat, "axis": axis, "expansion": expansion,
                                             "reduced_at": reduced_at})
