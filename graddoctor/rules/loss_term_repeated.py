from __future__ import annotations

from ..findings import Severity
from .base import Rule


class LossTermRepeated(Rule):
    """
    ## What it does
    Finds a loss term written twice where the second was meant to take another operand: the
    same loss function called again on the same prediction tensor and the same target tensor,
    with the same options, and both terms backpropagated. Mixup or CutMix whose second term
    reuses the first labels (`lam * criterion(out, y_a) + (1 - lam) * criterion(out, y_a)`), a
    symmetric contrastive loss whose second direction was meant on `logits.t()`, an auxiliary
    loss computed on the main head's output. Each call of cross_entropy, nll_loss and the binary
    cross-entropies (functional or module) with a gradient is keyed by its prediction, its
    target's storage and every other argument, between two backwards; a repeat is confirmed in
    the graph of the first backwards (the loss's start node twice on that prediction). It
    points at the second call.

    ## Why is this bad?
    The two terms are one term with its weight changed: `lam * L + (1 - lam) * L` is `L`. The
    operand the second term was written for (the partner samples' labels, the other direction
    of the similarity matrix, the auxiliary head) never reaches the loss, so mixup trains each
    mixed input towards one label only, the symmetric loss is one-sided, the auxiliary head gets
    no gradient. Nothing fails and the loss still falls.

    ## Example
    ```python
    def mixup_criterion(criterion, pred, y_a, y_b, lam):
        return lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_a)
    ```

    ## Use instead
    ```python
    def mixup_criterion(criterion, pred, y_a, y_b, lam):
        return lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_b)
    ```

    ## Stays silent on
    The terms of mixup and CutMix on `y_a` and `y_b`; one loss per head (deep supervision) on
    the same labels; a symmetric loss on `logits` and `logits.t()`; the same prediction and
    labels with other options (a label-smoothed and a plain cross-entropy blended, class
    weights); a loss computed again only to be logged (`.item()`, not in the graph); per-element
    losses (`reduction="none"`), which are often weighted apart afterwards; losses other than
    cross_entropy, nll_loss and the binary cross-entropies (not watched). Not told apart: the
    same term added twice on purpose reads as the bug.
    """

    code = "GD187"
    slug = "loss-term-repeated"
    severity = Severity.WARNING
    summary = ("the same loss is computed twice on the same prediction and target and both terms "
               "are summed: the operand the second term was meant for never reaches the loss")
    fix = ("give the second term the operand it was written for (mixup's y_b, logits.t(), the "
           "auxiliary head's output)")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("loss_repeated"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None:
                continue  # nothing trained makes the prediction
            fn, first = e.get("fn", "the loss"), e.get("first_line")
            where = ("on the same line" if first == e.loc.line else
                     f"as on line {first}" if first is not None else "as before")
            yield self.finding(
                f"{fn} is called again on the same prediction and the same target, with the same "
                f"options, {where}, and both terms reach the loss: their sum is one term with its "
                f"weight changed (lam * L + (1 - lam) * L is L). The operand this call was meant "
                f"to take (mixup's second labels, the transposed similarities, another head's "
                f"output) never reaches the loss, so {a.names(pids)} train on one term only",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"fn": fn, "first_line": first, "params": pids[:16]})
