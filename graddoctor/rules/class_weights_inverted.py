from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule, related

_BUILDERS = {"cross_entropy": ("CrossEntropyLoss", "cross_entropy"), "nll_loss": ("NLLLoss", "nll_loss"),
             "binary_cross_entropy_with_logits": ("BCEWithLogitsLoss", "binary_cross_entropy_with_logits")}


def _pct(share: float) -> str:
    return f"{share * 100:.3g} %"


class ClassWeightsInverted(Rule):
    """
    ## What it does
    Finds a classification loss whose per-class weights grow with how often each class occurs
    among its targets: `cross_entropy` / `nll_loss` (or `nn.CrossEntropyLoss`, `nn.NLLLoss`)
    given `weight=` that ranks the classes as their frequency does (the most frequent class
    weighs the most, the rarest the least), or `binary_cross_entropy_with_logits` given a
    `pos_weight` below 1 for outputs whose positives are rare, or equal to positives / negatives
    (to within a factor of 1.5) for outputs whose positives are the minority. The targets of the first calls
    are counted per class. It points at the call that passes the weights (the loss's
    construction, `nn.CrossEntropyLoss(weight=...)`) when the script has one, else at the loss
    call.

    ## Why is this bad?
    Class weights are meant to counter an imbalance: the inverse of each class's frequency
    (`pos_weight = negatives / positives`). Weights proportional to the frequency (`counts /
    counts.sum()`, the inversion forgotten; `pos_weight = positives / negatives`) do the opposite:
    the frequent classes weigh even more, the rare ones are all but ignored, and the model
    learns to predict the majority class. The loss still goes down; nothing fails.

    ## Example
    ```python
    counts = torch.bincount(train_labels, minlength=C).float()
    criterion = nn.CrossEntropyLoss(weight=counts / counts.sum())
    ```

    ## Use instead
    ```python
    counts = torch.bincount(train_labels, minlength=C).float()
    criterion = nn.CrossEntropyLoss(weight=counts.sum() / (C * counts))
    ```

    ## Stays silent on
    Inverse-frequency weights (and their square root, effective-number weights); weights that
    do not follow the frequencies (a class weighed up for its cost); a weight of 0 for a
    padding or ignored class; balanced targets (the most frequent class less than 3 times the
    rarest seen); weights within a factor of 2 of each other; `pos_weight` above 1, or below 1
    for outputs whose positives are common; class-probability targets.
    """

    code = "GD150"
    slug = "class-weights-inverted"
    severity = Severity.WARNING
    summary = ("a loss's class weights grow with the classes' frequency (proportional, not "
               "inverse): the frequent classes weigh more and the rare ones are ignored")
    fix = "weigh each class by the inverse of its frequency: weight = counts.sum() / (C * counts)"

    def check(self, a):
        for e in a.of_kind("class_weights"):
            fn = e.get("fn", "cross_entropy")
            loc, notes = self._weighted_call(a, e, fn), ()
            if loc is not e.loc:
                notes = (related(e, "the loss called with those weights"),)
            classes, shares, weights = e.get("classes") or [], e.get("shares") or [], e.get("weights") or []
            evidence = {"function": fn, "classes": classes, "shares": shares, "weights": weights}
            if fn == "binary_cross_entropy_with_logits":
                shown = ", ".join(f"output {c} ({_pct(s)} positives) has pos_weight {w:g}"
                                  for c, s, w in zip(classes, shares, weights))
                yield self.finding(
                    f"binary_cross_entropy_with_logits weighs the positives of outputs whose "
                    f"positives are the minority below 1: {shown}, so those positives count even less "
                    f"than without a weight (pos_weight = positives / negatives, inverted?)",
                    loc, related=notes, step=a.next_step_number(e.seq), evidence=evidence,
                    fix="set pos_weight = negatives / positives per output (above 1 for rare "
                        "positives)")
                continue
            if len(classes) < 2:
                continue
            yield self.finding(
                f"{fn}'s class weights grow with the classes' frequency: class {classes[0]} "
                f"({_pct(shares[0])} of the targets seen) weighs {weights[0]:g}, class "
                f"{classes[1]} ({_pct(shares[1])}) weighs {weights[1]:g}, so the frequent "
                f"classes count more and the rare ones are all but ignored: weights proportional "
                f"to the counts, where their inverse was meant",
                loc, related=notes, step=a.next_step_number(e.seq), evidence=evidence)

    @staticmethod
    def _weighted_call(a, e, fn: str):
        """The one call of the script that builds or calls this loss with its weights
        (``nn.CrossEntropyLoss(weight=w)``), else the event's location (the loss call)."""
        if e.loc is None:
            return e.loc
        keyword = "pos_weight=" if fn == "binary_cross_entropy_with_logits" else "weight="
        found = [c for c in a.source.calls_named(e.loc.path, _BUILDERS.get(fn, ()))
                 if keyword in c[1].replace(" ", "")]
        if len(found) != 1:
            return e.loc
        return Location(e.loc.path, found[0][0])
