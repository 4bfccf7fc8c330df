from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_BUILDERS = {"cross_entropy": ("CrossEntropyLoss", "cross_entropy"), "nll_loss": ("NLLLoss", "nll_loss"),
             "binary_cross_entropy_with_logits": ("BCEWithLogitsLoss", "binary_cross_entropy_with_logits"),
             "binary_cross_entropy": ("BCELoss", "binary_cross_entropy")}
_WEIGHT_KEYWORD = re.compile(r"(?<![A-Za-z_])weight\s*=")


class ClassWeightsUniform(Rule):
    """
    ## What it does
    Finds a loss whose `weight` holds one value other than 1 at each of its first calls, where
    a rebalancing was meant: `binary_cross_entropy_with_logits` (or `BCEWithLogitsLoss`,
    `binary_cross_entropy`) given a scalar or constant `weight=` above 1 for targets whose
    positives are the minority, and no `pos_weight` (`BCEWithLogitsLoss(weight=torch.tensor(9.0))`
    written for `pos_weight=`); `cross_entropy` / `nll_loss` (or their modules) given class
    weights that are all equal (`torch.full((C,), 2.5)`). It points at the call that passes the
    weight (the loss's construction), or, for class weights, at the statement that computes them
    when it is one of its own.

    ## Why is this bad?
    `weight` multiplies every element's loss: one value everywhere only rescales the loss (and
    the gradient), which Adam all but cancels and SGD reads as a larger learning rate. The rare
    positives or classes weigh exactly as much as before: the rebalancing the script was written
    for never happens, and the model still leans to the majority. `pos_weight` is the argument
    that weighs the positive targets of a binary cross-entropy.

    ## Example
    ```python
    criterion = nn.BCEWithLogitsLoss(weight=torch.tensor(n_neg / n_pos))
    ```

    ## Use instead
    ```python
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(n_neg / n_pos))
    ```

    ## Stays silent on
    `pos_weight=`; a per-sample or per-element weight that varies (a mask of annotated labels);
    class weights that differ between classes; a weight of 1 (`torch.ones(C)`: a placeholder);
    a scalar weight beside a `pos_weight`, or one below 1, or on targets whose positives are not
    the minority (a loss scale); a weight that changes between calls.
    """

    code = "GD376"
    slug = "class-weights-uniform"
    severity = Severity.INFO
    summary = ("a loss's weight is one value everywhere (a scalar weight= meant as pos_weight, "
               "class weights all equal): it only rescales the loss, nothing is rebalanced")
    fix = ("weigh the positives with pos_weight (negatives / positives), or give each class its "
           "own weight (e.g. the inverse of its frequency)")

    def check(self, a):
        for e in a.of_kind("uniform_weight"):
            fn = e.get("fn", "cross_entropy")
            value, classes = float(e.get("value", 0.0)), int(e.get("classes", 0))
            loc = self._weighted_call(a, e, fn)
            evidence = {"function": fn, "value": value, "entries": e.get("numel"),
                        "classes": classes, "positives": e.get("positives")}
            if fn.startswith("binary_"):
                share = e.get("positives")
                shown = f"{share * 100:.3g} %" if isinstance(share, (int, float)) else "a minority"
                yield self.finding(
                    f"{fn} is given weight={value:g}, one value for every element, while its "
                    f"positives are the minority ({shown} of the targets seen): `weight` "
                    f"multiplies every element's loss, positives and negatives alike, so it only "
                    f"rescales the loss and the positives weigh no more than before; the "
                    f"argument that weighs the positives is `pos_weight`",
                    loc, step=a.next_step_number(e.seq), evidence=evidence,
                    fix=(f"pass it as pos_weight=torch.tensor({value:g}) (negatives / positives), "
                         f"not weight=" + ("; BCELoss has no pos_weight: use BCEWithLogitsLoss on "
                                           "the logits" if fn == "binary_cross_entropy" else "")))
                continue
            yield self.finding(
                f"{fn}'s class weights are all {value:g} (over its {classes} classes): equal "
                f"class weights only rescale the loss, so no class weighs more than another and "
                f"the rebalancing they were given for never happens",
                loc, step=a.next_step_number(e.seq), evidence=evidence,
                fix=("give each class its own weight, e.g. the inverse of its frequency: "
                     "`counts.sum() / (C * counts)` with `counts = torch.bincount(train_labels)`"))

    @staticmethod
    def _weighted_call(a, e, fn: str):
        """The one call of the script that builds or calls this loss with ``weight=``; for class
        weights computed in a statement of their own (``w = torch.full((C,), 2.5)``), that
        statement; else the event's location (the loss call)."""
        if e.loc is None:
            return e.loc
        found = [c for c in a.source.calls_named(e.loc.path, _BUILDERS.get(fn, ()))
                 if _WEIGHT_KEYWORD.search(c[1])]
        if len(found) != 1:
            return e.loc
        line = found[0][0]
        if fn.startswith("binary_"):
            return Location(e.loc.path, line)  # the keyword is what to change
        for builder in _BUILDERS.get(fn, ()):
            if builder[:1].isupper():
                origin = a.source.argument_origin(e.loc.path, line, builder, "weight")
            else:
                name = a.source.call_argument(e.loc.path, line, builder, 99, "weight")
                origin = (a.source.value_origin(e.loc.path, line, name)
                          if name is not None and name.isidentifier() else None)
            if origin is not None and origin[0] != line:
                return Location(e.loc.path, origin[0])
        return Location(e.loc.path, line)
