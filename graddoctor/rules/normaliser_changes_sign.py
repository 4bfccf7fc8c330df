from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class NormaliserChangesSign(Rule):
    """
    ## What it does
    Finds a quotient whose denominator is a sum of products of activations that takes both
    signs at the first steps: linear attention's normaliser `phi(q) . sum_j phi(k_j)` with a
    feature map that can be negative (`F.elu(x)` without the `+ 1`, the raw projections,
    `tanh`), or weights divided by their own sum (`w / w.sum(-1, keepdim=True)`) that are not
    positive. Seen in the graph of the first 3 backwards: a division (or `1 / x`) whose
    denominator comes out of a sum (`einsum`/`bmm`/`sum`/`cumsum`, through views and an added
    eps) and holds at least 5 % negative and 5 % positive values. Reported at the feature map's
    call when the source holds one call of the signed activation found below the sum, else at
    the backward.

    ## Why is this bad?
    The quotient is meant as a weighted mean, which needs positive weights. With signed
    features the normaliser is a sum of terms of both signs: it crosses zero, the output
    explodes near it and flips sign past it, and the gradients through it are dominated by the
    few positions where the denominator is tiny. Nothing fails at first; the model trains much
    worse than it should, or turns to NaN later.

    ## Example
    ```python
    def feature_map(x):
        return F.elu(x)

    q, k = feature_map(q), feature_map(k)
    kv = torch.einsum("bthd,bthe->bthde", k, v).cumsum(1)
    z = 1 / (torch.einsum("bthd,bthd->bth", q, k.cumsum(1)) + eps)
    ```

    ## Use instead
    ```python
    def feature_map(x):
        return F.elu(x) + 1  # positive: the normaliser is a sum of positive terms
    ```

    ## Stays silent on
    Denominators of one sign: `elu(x) + 1`, `relu(x)` plus an eps, `exp`, softmax's sums of
    exponentials, norms, counts; a quotient by a tensor without graph (a target, a constant);
    a denominator made by no sum (a learned temperature, a difference of two values); a soft
    dice or IoU on logits (overlap-on-raw-scores reports that one bug).
    """

    code = "GD389"
    slug = "normaliser-changes-sign"
    severity = Severity.WARNING
    summary = ("a denominator made as a sum of products of activations (a linear attention's "
               "normaliser, weights over their own sum) takes both signs: the features are "
               "not positive")
    fix = ("make the summed features positive: F.elu(x) + 1 (or F.relu(x) + eps, exp) as the "
           "feature map, or normalise positive weights (softmax, softplus)")

    def check(self, a):
        for e in a.of_kind("normaliser_sign"):
            feature = e.get("feature")
            loc, related, text = e.loc, (), None
            if e.loc is not None and feature:
                calls = a.source.calls_named(e.loc.path, frozenset((feature,)))
                if len({c[0] for c in calls}) == 1:  # one line (`F.elu(q), F.elu(k)`)
                    loc = Location(e.loc.path, calls[0][0])
                    text = calls[0][1].strip()
                    related = (Related(e.loc, "the backward whose graph holds the quotient"),)
            shape = "×".join(str(s) for s in e["shape"])
            negative, positive = e["negative"], e["positive"]
            made = f"by `{text}`" if text else (f"by {feature} features" if feature else
                                                "by features that are not constrained positive")
            fix = (f"make the features positive: `{text} + 1`" if text and feature == "elu"
                   else self.fix)
            yield self.finding(
                f"a denominator ({shape}) summed from products of activations made {made} "
                f"holds negative values ({negative:.0%}) as well as positive ones "
                f"({positive:.0%}): a normaliser meant as a sum of positive weights (linear "
                f"attention's q . sum(k)) crosses zero, so the quotient explodes near it and "
                f"flips sign past it",
                loc, related=related, step=a.next_step_number(e.seq), fix=fix,
                evidence={"op": e["op"], "sum": e["sum"], "shape": list(e["shape"]),
                          "negative": negative, "positive": positive, "feature": feature})
