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

    Any other term, hand-written ones included, is read from the graph: at the backwards after
    the first two optimizer steps, the terms summed into the loss (below its additions,
    subtractions, negations, products by a number, sums, means and views) are compared two by
    two, and two that are the same ops with the same arguments on the same inputs (saved
    tensors equal in value) are one term written twice: a Chamfer distance whose second
    direction repeats the first (`d.min(dim=2)` twice), a smoothness term whose vertical
    differences repeat the horizontal slicing, a bidirectional or cycle loss that maps the same
    images again, a loop over scales or layers that reads `preds[0]` at every turn. The forward
    before that backward is followed to place the copy: it points at the line where the two
    copies part (the copy's own line, the line that called a helper twice, or the loop's line).

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
    cross_entropy, nll_loss and the binary cross-entropies (not watched by their calls). From
    the graph: terms that differ in one operand, option, axis or slice; two passes with dropout
    or any random draw (R-Drop, Monte-Carlo samples, two noise draws of one batch), and a part
    of such a pass that took no draw itself when the script drew random numbers between the two
    copies (each weight sample's log q(w) holds the same -log sigma in Bayes by Backprop); terms
    weighted apart by computed tensors (masks, per-pixel weights); terms checkpointed or
    offloaded (never unpacked); entries of a parameter read twice at data-given positions (a
    CRF's gold path through one transition twice, an embedding row picked twice); a script with
    one optimizer step only. Not told apart:
    the same term added twice on purpose reads as the bug.
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
        told = set()
        for e in a.of_kind("loss_repeated"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None:
                continue  # nothing trained makes the prediction
            fn, first = e.get("fn", "the loss"), e.get("first_line")
            where = ("on the same line" if first == e.loc.line else
                     f"as on line {first}" if first is not None else "as before")
            told.add(e.loc)
            yield self.finding(
                f"{fn} is called again on the same prediction and the same target, with the same "
                f"options, {where}, and both terms reach the loss: their sum is one term with its "
                f"weight changed (lam * L + (1 - lam) * L is L). The operand this call was meant "
                f"to take (mixup's second labels, the transposed similarities, another head's "
                f"output) never reaches the loss, so {a.names(pids)} train on one term only",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"fn": fn, "first_line": first, "params": pids[:16]})
        for e in a.of_kind("term_repeated"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None or e.loc in told:
                continue
            told.add(e.loc)
            first = e.get("first_line")
            where = ("twice on this line" if first == e.loc.line else
                     f"here and on line {first}" if first is not None else "twice")
            yield self.finding(
                f"this term of the loss is computed {where} with the same ops, the same arguments "
                f"and the same inputs, and both copies are summed into the loss: their sum is one "
                f"term with its weight changed. The copy was meant to take another operand (the "
                f"other axis or direction, the other image or output, the loop's own index), "
                f"which never reaches the loss, so {a.names(pids)} train on one term only",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"op": e.get("op"), "first_line": first, "params": pids[:16]},
                fix=("change the copy's operand to the one it was written for (dim=1 for the "
                     "other direction, the other axis's slices, the other image or output, the "
                     "loop's index)"))
