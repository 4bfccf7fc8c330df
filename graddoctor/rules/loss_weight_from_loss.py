from __future__ import annotations

from ..analysis.self_normalised import self_normalising_line
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
    `1 - x`) of a reduced loss the other side holds. Also a term divided by its own size with
    the divisor attached: `lmbda = alpha / q.abs().mean()` (TD3+BC's normalising lambda;
    `x.norm()` or a root mean square likewise) multiplying `q.mean()`, pointed at the
    divisor's assignment.

    ## Why is this bad?
    Autograd differentiates the weights too. Balancing weights left attached are themselves
    minimised: the optimizer lowers the weight of the larger loss as well as the loss, so the
    update is not the weighted sum of the tasks' gradients the script meant, and the balance
    drifts toward whatever term is easiest to shrink. A focal weight computed from the batch's
    mean loss is one number for the whole batch: it only rescales the step, and the hard
    samples it was written to emphasise get the same weight as the easy ones. A term times
    `c / mean(|x|)` of its own `x` is `c * mean(x) / mean(|x|)`: it does not change with `x`'s
    size (with `x` of one sign it is the constant `c`), so its gradient cancels and the other
    terms alone train the model (TD3+BC turns into plain behaviour cloning).

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
    per-sample terms that were averaged before (no loss node to recognise). A normaliser
    detached (`q.abs().mean().detach()`, `.item()`), or of other values than the term's (a
    Pearson correlation's `cov / (x.std() * y.std())`: its numerator is no mean of `x`); a
    Sharpe ratio `r.mean() / r.std()` (a std centres `r`: an objective of its own).
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
            if "scale" in kinds:
                yield self._scale_finding(a, loc, kinds, event)
                kinds = kinds - {"scale"}
                if not kinds:
                    continue
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

    def _scale_finding(self, a, loc, kinds, event):
        found = self_normalising_line(a.source.full(loc.path), loc.line)
        where = Location(loc.path, found[0]) if found else loc
        said = f"`{found[1]}`" if found else "a factor of this loss"
        name = f"`{found[2]}`" if found else "the term's values"
        return self.finding(
            f"{said} divides by the size of {name} and keeps its graph, and the loss multiplies "
            f"the mean of {name} by it: the product no longer changes with the size of {name} "
            f"(with {name} of one sign it is a constant, its gradient 0), so the divisor's "
            f"gradient undoes the term's instead of only rescaling it, and the loss's other "
            f"terms train the model (TD3+BC's normalising lambda left attached: the policy "
            f"learns plain behaviour cloning)",
            where, evidence={"kinds": sorted(kinds), "terms": event.get("terms")},
            fix=("detach the normaliser: compute it from `.abs().mean().detach()` (or `.item()`), "
                 "so it only rescales the term"))
