from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

class LossWeightFromLoss(Rule):
    """
    ## What it does
    Finds loss weights computed from the loss terms themselves and left attached to the graph:
    balancing weights `w = l_cls / (l_cls + l_reg)`, a softmax or exp of the stacked task
    losses, and a focal-style modulation `(1 - exp(-ce)) ** gamma * ce` whose `ce` is already
    the batch's mean (`reduction="mean"`, the default). Seen in the graph of the first
    backwards: a product of two scalars (or of a short stack of terms and its weights) in the
    loss's linear top, one side a non-linear function (quotient, exp, power, softmax, sigmoid,
    `1 - x`) of a reduced loss the other side holds.

    ## Why is this bad?
    Autograd differentiates the weights too. Balancing weights left attached are themselves
    minimised: the optimizer lowers the weight of the larger loss as well as the loss, so the
    update is not the weighted sum of the tasks' gradients the script meant, and the balance
    drifts toward whatever term is easiest to shrink. A focal weight computed from the batch's
    mean loss is one number for the whole batch: it only rescales the step, and the hard
    samples it was written to emphasise get the same weight as the easy ones.

    ## Example
    ```python
    l_cls, l_reg = F.cross_entropy(logits, y), F.mse_loss(pred, t)
    total = l_cls + l_reg
    loss = l_cls / total * l_cls + l_reg / total * l_reg
    ```

    ## Use instead
    ```python
    w_cls, w_reg = (l_cls / total).detach(), (l_reg / total).detach()
    loss = w_cls * l_cls + w_reg * l_reg
    # a focal loss: per-sample terms first, the mean last
    ce = F.cross_entropy(logits, y, reduction="none")
    loss = ((1 - torch.exp(-ce)) ** gamma * ce).mean()
    ```

    ## Stays silent on
    Weights detached (`.detach()`, `.item()`, floats from a history of losses: DWA), learned
    weights (Kendall's uncertainty weighting, GradNorm's parameters), a focal loss on
    per-sample terms (`reduction="none"`), a quotient of two different losses as the objective
    itself (a Fisher or Rayleigh ratio), a loss divided by its own detached value. Not seen:
    weights made from losses inside a custom `autograd.Function`, or computed by hand from
    per-sample terms that were averaged before (no loss node to recognise).
    """

    code = "GD198"
    slug = "loss-weight-from-loss"
    severity = Severity.WARNING
    summary = ("a loss weight is computed from the loss terms with their graph: the optimizer "
               "also minimises the weight, or a per-sample weight is one number for the batch")
    fix = "detach the weights computed from the losses (`w = (l_a / total).detach()`)"

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("loss_derived_weight", ()):
            loc = event.loc
            if loc is None or (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            kinds = set(event.get("kinds") or ())
            losses, weights = a.source.loss_sites(loc.path)
            if "self" in kinds and "ratio" not in kinds:
                site = next(((losses[names[0]], names[0]) for _, names, _ in weights
                             if len(names) == 1 and names[0] in losses), None)
                where = Location(loc.path, site[0]) if site else loc
                named = f"`{site[1]}`" if site else "the loss"
                yield self.finding(
                    f"a per-sample weight (focal-style, `(1 - exp(-ce)) ** gamma`) is computed "
                    f"from {named} after it was reduced to the batch's mean: the weight is one "
                    f"number for the whole batch, so it only rescales the step, and the hard "
                    f"samples get the same weight as the easy ones (it also keeps its graph, so "
                    f"its own gradient is added)",
                    where, evidence={"kinds": sorted(kinds), "terms": event.get("terms")},
                    fix=(f"compute {named} per sample (`reduction=\"none\"`) and take the mean "
                         f"after weighting each sample"))
                continue
            site = weights[0] if weights else None
            where = Location(loc.path, site[0]) if site else loc
            what = (f"`{site[2].strip()}` computes loss weights from the loss terms "
                    f"({', '.join(site[1])}) and keeps their graph" if site else
                    "this loss multiplies its terms by weights computed from the terms "
                    "themselves, with their graph")
            yield self.finding(
                f"{what}: "
                f"autograd differentiates the weights too, so the optimizer also lowers the "
                f"weight of each term it can shrink, and the update is not the weighted sum of "
                f"the terms' gradients the weights were meant to give",
                where, evidence={"kinds": sorted(kinds), "terms": event.get("terms")},
                fix=self.fix)
