from __future__ import annotations

from ..analysis.prune_masks import inverted_prune_masks
from ..findings import Severity
from ..trace import Location
from .base import Rule


class PruneMaskKeepsSmallest(Rule):
    """
    ## What it does
    Finds a magnitude-pruning mask written the wrong way round: a mask that keeps the weights
    whose magnitude is below the pruning threshold (`(w.abs() < thresh).float()`, `.lt`, `.le`,
    `thresh > w.abs()`) and multiplies weights with it (`p.mul_(mask)`, `w.data *= mask`,
    `w * mask`), or an in-place write that zeroes the weights above it (`w[w.abs() > thresh] = 0`,
    `w.masked_fill_(w.abs() >= thresh, 0)`). Read from the script's source, in the files whose
    backwards ran: the threshold is a name assigned an order statistic of magnitudes
    (`w.abs().flatten().kthvalue(k).values`, `torch.quantile(w.abs(), s)`, a `topk`/`sort`/
    `percentile` of an absolute value, or a name taken from one).

    ## Why is this bad?
    Magnitude pruning removes the weights that matter least, the smallest ones. A mask that
    keeps them instead zeroes the largest weights, the ones the network relies on: accuracy
    collapses at the first pruning and the fine-tuning that follows has to relearn the model
    from its smallest weights. The sparsity is the one asked for, so the pruning looks done;
    only the accuracy says otherwise.

    ## Example
    ```python
    thresh = p.detach().abs().flatten().kthvalue(k).values
    masks[name] = (p.detach().abs() < thresh).float()
    ...
    p.mul_(masks[name])
    ```

    ## Use instead
    ```python
    masks[name] = (p.detach().abs() > thresh).float()
    ```

    ## Stays silent on
    `>`/`>=`/`gt`/`ge` masks; zeroing the small weights in place (`w[w.abs() < thresh] = 0`,
    `masked_fill_(w.abs() <= thresh, 0)`); a mask the script also uses turned around (`~mask`,
    `1 - mask`), or one beside the opposite comparison of the same threshold (an outlier split
    that keeps the large weights apart, as LLM.int8's decomposition does); thresholds that are no
    order statistic of magnitudes (a fixed clip value); `torch.nn.utils.prune`, whose masks
    torch builds.
    """

    code = "GD413"
    slug = "prune-mask-keeps-smallest"
    severity = Severity.WARNING
    summary = ("a magnitude-pruning mask keeps the weights below the threshold: the largest "
               "weights are pruned and the smallest kept")
    fix = "compare the other way round: keep the weights whose magnitude is above the threshold"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, kept, use_line in inverted_prune_masks(a.source.full(path)):
                applied = (f"applied to the weights at line {use_line}" if use_line != line
                           else "written into the weights here")
                yield self.finding(
                    f"`{text}` keeps the weights whose magnitude is below the pruning threshold "
                    f"and is {applied}: the largest weights, the ones the network relies on, are "
                    f"pruned and the smallest kept",
                    Location(path, line, None),
                    fix=f"keep the large weights: `{kept}`",
                    evidence={"kept": kept, "use_line": use_line})
