from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_VARIES = 1.10  # the largest kept share over the smallest from which the step changes per batch
_PRODUCT_MEAN = re.compile(r"\(\s*([\w.\[\]]+(?:\(\))?)\s*\*\s*([\w.\[\]]+(?:\([\w.]*\))?)\s*\)\s*\.mean\(\)")


def _mask_name(line: str, operand) -> tuple[str, str] | None:
    """``(the product, the mask's text)`` of a ``(a * b).mean()`` on the line, the mask being the
    operand at position ``operand`` (0: left, 1: right, as the graph tells); None when the line
    holds no such product."""
    match = _PRODUCT_MEAN.search(line)
    if match is None or operand not in (0, 1):
        return None
    left, right = match.group(1), match.group(2)
    return f"({left} * {right})", (left, right)[operand]


class MaskedMeanCountsPadding(Rule):
    """
    ## What it does
    Finds a per-element loss multiplied by a 0/1 mask (`reduction="none"` then `* mask`,
    `torch.where(valid, loss, 0)`, `loss.masked_fill(pad, 0)`), or a token loss computed with
    `reduction="none"` whose ignored targets (`ignore_index`: -100, a pad id) give 0, and then
    averaged over every element, the masked-out or ignored ones included: `.mean()`, or `.sum()` divided by `numel()` or by a
    constant equal to it (`B * T`). It is read from the backpropagated loss's autograd graph at
    the first backwards, and points at the line that takes the mean.

    ## Why is this bad?
    The masked positions contribute 0 to the sum but still count in the denominator, so the
    loss and its gradient are scaled by the share of positions the mask keeps. When that share
    changes from batch to batch (padding, invalid pixels), a batch with more padding trains
    with a smaller step, and the reported loss is too low by that share. A warning when the
    kept share varies across the first batches (the update changes with the batch); info when
    it stays the same (a constant factor: a smaller learning rate and an off reported loss).

    ## Example
    ```python
    loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    loss = (loss * mask).mean()
    ```

    ## Use instead
    ```python
    loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    loss = (loss * mask).sum() / mask.sum().clamp(min=1)
    ```

    Or set the padded targets to the loss's `ignore_index`, or average the kept positions only
    (`loss[mask].mean()`, `loss.masked_select(mask).mean()`).

    ## Stays silent on
    `/ mask.sum()` (clamped or not) and per-row counts; `ignore_index` with the loss's own
    mean reduction; an unreduced loss with no ignored target in the batch; `masked_select` and
    boolean indexing before the mean; a per-sequence sum averaged over the batch
    (`(loss * mask).sum(1).mean()`); weights that are not 0/1; a mask with under 10 % zeros;
    dropout masks inside the model; attention masks; a mask that is the same tensor at every
    batch (a fixed triangle over pairs: a constant of the model, the scale a constant weight);
    a one-dimensional masked loss over samples with no sequence or image axis flattened into it
    (FixMatch's `(ce(logits_u, pseudo, reduction="none") * (confidence >= tau)).mean()`, an
    average over every unlabelled sample by the method's definition).
    """

    code = "GD171"
    slug = "masked-mean-counts-padding"
    severity = Severity.WARNING
    summary = "a masked loss is averaged over every position, the masked-out ones included"
    fix = "divide the masked sum by the mask's sum: (loss * mask).sum() / mask.sum().clamp(min=1)"

    def check(self, a):
        by_line: dict = {}
        for e in a.of_kind("masked_mean"):
            if e.loc is not None:
                by_line.setdefault((e.loc.path, e.loc.line), []).append(e)
        for events in by_line.values():
            kept = [float(e.get("kept")) for e in events]
            if len(events) > 1 and all(e.get("same_mask") for e in events):
                continue  # one fixed mask: a constant weight of the model, not the batch's padding
            varies = len(kept) > 1 and min(kept) > 0 and max(kept) / min(kept) >= _VARIES
            first = events[0]
            how, reduced = first.get("how"), first.get("reduced") or "mean"
            shares = ", ".join(f"{k:.0%}" for k in kept[:4])
            divided = ("summed and divided by the number of all its elements" if "numel" in reduced
                       else "averaged over all its elements")
            masked = {"where": "zeroed with torch.where", "masked_fill": "zeroed with masked_fill",
                      "ignore_index": ("computed with reduction='none', whose ignored targets "
                                       "(ignore_index) give 0,")}.get(how, "multiplied by a 0/1 mask")
            if varies:
                scale = (f"the mask keeps {shares} of the positions in the first batches, so each "
                         "batch's loss and gradient are scaled by its own share: batches with more "
                         "padding train with a smaller step")
            else:
                scale = (f"the mask keeps {shares} of the positions, so the loss and gradient are "
                         "scaled by that share (a constant factor here: a smaller learning rate, "
                         "and a reported loss too low by it)")
            message = (f"a per-element loss {masked} is {divided}, the masked-out positions "
                       f"included: {scale}")
            yield self.finding(
                message, self._where(a, first), fix=self._fix(a, first, how, reduced),
                severity=Severity.WARNING if varies else Severity.INFO,
                evidence={"kept": kept, "how": how, "reduced": reduced,
                          "elements": first.get("elements")},
            )

    def _where(self, a, e) -> Location:
        """The mean's line: the event's, or, for a mean torch.mean took (located at the backward),
        the assignment of the backpropagated loss when it takes a mean."""
        if e.get("at_mean"):
            return e.loc
        found = a.source.loss_assignment(e.loc.path, e.loc.line)
        if found is not None and re.search(r"\bmean\(", found[1]):
            return Location(e.loc.path, found[0])
        return e.loc

    def _fix(self, a, e, how, reduced) -> str:
        at_mean = e.get("at_mean") and "numel" not in reduced  # the line calls .mean()
        line = a.source.line_text(e.loc.path, e.loc.line) if at_mean else ""
        named = _mask_name(line, e.get("mask_operand"))
        if named is not None and how == "product":
            product, mask = named
            return (f"divide by the kept positions, not all of them: "
                    f"{product}.sum() / {mask}.sum().clamp(min=1)")
        if how == "ignore_index":
            return ("let the loss average the kept targets itself (drop reduction='none': its mean "
                    "skips the ignored targets), or divide the sum by their number: "
                    "loss.sum() / (labels != ignore_index).sum().clamp(min=1)")
        if how in ("where", "masked_fill"):
            return ("average the kept positions only: loss[keep].mean(), or the masked sum "
                    "divided by the number of kept positions (keep.sum().clamp(min=1))")
        if "numel" in reduced:
            return ("divide the masked sum by the mask's sum (mask.sum().clamp(min=1)), not by "
                    "the number of elements")
        return self.fix
