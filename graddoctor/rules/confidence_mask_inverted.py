from __future__ import annotations

from ..analysis.confidence_masks import inverted_confidence_masks
from ..findings import Severity
from ..trace import Location
from .base import Rule


class ConfidenceMaskInverted(Rule):
    """
    ## What it does
    Finds a pseudo-label confidence mask that keeps the rows whose top class probability is
    below the threshold and weighs or selects the unlabelled loss with it:
    `mask = max_probs.lt(threshold)` (or `<`, `<=`, `le`, `threshold > conf`) multiplying a
    per-sample loss, or indexing it (`loss[conf < tau]`). Read from the script's source, in the
    files whose backwards ran: the compared value is the largest class probability of each row
    (`torch.max(softmax(...), dim=-1)`, `probs.max(1)[0]`, `.values`, of a name the script
    assigned a softmax or sigmoid to), and the script never turns the mask around (`~mask`,
    `1 - mask`, `logical_not`, `masked_fill(mask, 0)`, `where(mask, ...)`).

    ## Why is this bad?
    Pseudo-labelling (FixMatch, UDA, Noisy Student, self-training) trusts the model's guess only
    where it is confident: the mask is 1 where the top probability reaches the threshold. Kept
    the other way round, the unlabelled loss trains on exactly the guesses the model is unsure
    of, mostly wrong ones, and ignores the reliable ones: the model is taught its own noise and
    accuracy falls below what the labelled data alone gives. Nothing fails, and the loss still
    falls.

    ## Example
    ```python
    max_probs, targets_u = torch.max(torch.softmax(logits_u_w.detach(), dim=-1), dim=-1)
    mask = max_probs.lt(threshold).float()
    Lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()
    ```

    ## Use instead
    ```python
    mask = max_probs.ge(threshold).float()
    ```

    ## Stays silent on
    `ge`/`gt`/`>=` masks; a low-confidence mask used to exclude rows (`loss.masked_fill(low, 0)`,
    `loss * (1 - low)`, `loss[~low]`); low-confidence counts kept for logging; comparisons of
    values that are not a row's top probability (entropies, losses, margins).
    """

    code = "GD326"
    slug = "confidence-mask-inverted"
    severity = Severity.WARNING
    summary = ("a pseudo-label mask keeps the rows whose confidence is below the threshold: the "
               "unlabelled loss trains on the unsure guesses and drops the confident ones")
    fix = "compare the other way round: keep the rows whose top probability reaches the threshold"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, confidence, kept, use_line in inverted_confidence_masks(a.source.full(path)):
                yield self.finding(
                    f"`{text}` keeps the rows whose top class probability `{confidence}` is below "
                    f"the threshold, and the loss at line {use_line} is weighed by it: the "
                    f"unlabelled loss trains on the pseudo-labels the model is unsure of (mostly "
                    f"wrong) and ignores the confident ones, so the model learns its own noise",
                    Location(path, line, None),
                    fix=f"keep the confident rows: `{kept}`",
                    evidence={"confidence": confidence, "use_line": use_line})
