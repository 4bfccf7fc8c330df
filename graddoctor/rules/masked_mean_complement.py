from __future__ import annotations

from ..analysis.complement_mean import complement_masked_means
from ..findings import Severity
from ..trace import Location
from .base import Rule


class MaskedMeanComplement(Rule):
    """
    ## What it does
    Finds a masked mean whose sum keeps the positions its count leaves out:
    `(loss * (1 - mask)).sum(1) / mask.sum(1)`, the numerator multiplied by the complement of
    the mask the denominator counts (`1 - m`, `~m`, `m.logical_not()`, `m == 0`, `m.eq(0)`,
    inline or through a name assigned it), both reduced over the same axes. Read from the
    script's source, in the files whose backwards ran; it points at the product with the
    complement.

    ## Why is this bad?
    A masked mean sums a per-token value over the positions a mask keeps and divides by their
    count, one mask on both sides. With the complement in the sum, the loss trains exactly the
    positions the mask was meant to drop (the prompt of a GRPO or SFT example, the padding, the
    tokens after the stop token) and none of those it keeps, scaled by the count of the other
    positions. The loss still moves, the run looks normal, and the completions never get a
    gradient.

    ## Example
    ```python
    per_token_loss = -(ratio * advantages[:, None])
    loss = ((per_token_loss * (1 - completion_mask)).sum(1) / completion_mask.sum(1)).mean()
    ```

    ## Use instead
    ```python
    loss = ((per_token_loss * completion_mask).sum(1) / completion_mask.sum(1)).mean()
    ```

    ## Stays silent on
    The same mask on both sides (`(l * m).sum() / m.sum()`, clamped or plus an epsilon); the
    complement on both sides (`(l * (1 - m)).sum() / (1 - m).sum()`: a mean over the other
    positions, on purpose); sums and counts over different axes (a per-row sum divided by the
    batch's count); a complement that is not written as one (`gt.lt(1)` beside `gt.eq(1)`, as
    CenterNet's focal loss divides its negatives' loss by the count of positives). Not seen: a
    complement computed in another function, a mask inverted where it is made (`mask = ids ==
    pad` used as the kept positions).
    """

    code = "GD200"
    slug = "masked-mean-complement"
    severity = Severity.WARNING
    summary = ("a masked mean sums the complement of the mask it divides by: the loss trains the "
               "positions the mask drops")
    fix = "multiply by the mask you count: (loss * mask).sum(dim) / mask.sum(dim)"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, mask, complement in complement_masked_means(a.source.full(path)):
                what = (f"this masked mean multiplies by `{complement}`, the complement of `{mask}`, "
                        f"but divides by the count of `{mask}`: the loss is summed over the positions "
                        f"`{mask}` drops and none it keeps, so those positions get no gradient and "
                        f"the mean is scaled by the wrong count")
                yield self.finding(what, Location(path, line, None),
                                   fix=f"multiply by `{mask}` (the mask you count), not `{complement}`",
                                   evidence={"mask": mask, "complement": complement})
