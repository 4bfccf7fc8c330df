from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule, related

_WINDOW = 40  # lines above the backward searched for the centring
_CENTRED = re.compile(r"\.(mean|var|std)\(\s*(dim\s*=\s*|axis\s*=\s*)?0\s*[,)]"
                      r"|torch\.(mean|var|std)\(\s*[\w.\[\]]+\s*,\s*(dim\s*=\s*)?0\s*[,)]")


class LossIsBatchSpread(Rule):
    """
    ## What it does
    Finds a loss that is nothing but the spread of one batch of network outputs around their
    own batch mean: a one-class (Deep SVDD, compactness) objective whose centre is taken from
    the live batch with its gradient (`((z - z.mean(0)) ** 2).sum(1).mean()`), or the batch
    variance of the outputs minimised (`z.var(0).sum()`). At the first backwards the loss's
    graph is read from the top: through its reductions (`mean`, `sum`) and positive constant
    factors only, with no other term added, a `var`/`std` over axis 0 of a (samples, features)
    tensor, or a square or norm of `z - z.mean(0)` (either order) whose mean is over axis 0 of
    the same `z`. It points at the line that centres the batch (or at the backward).

    ## Why is this bad?
    The spread of a batch around its own mean is 0 for any constant output: the network can
    reach the minimum by mapping every input to one point (weights shrinking to 0), whatever
    the data. Deep SVDD fixes its centre `c` once, from the initial network, without
    gradient, so that only a map of the normal data close to `c` lowers the loss; with the
    centre moving with the outputs the loss falls to 0 while the hypersphere collapses and
    the anomaly score stops depending on the input.

    ## Example
    ```python
    for x in loader:
        z = encoder(x)
        loss = ((z - z.mean(0)) ** 2).sum(1).mean()   # the centre follows z
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        c = encoder(train_x).mean(0)                   # once, before training, then fixed
    for x in loader:
        z = encoder(x)
        loss = ((z - c) ** 2).sum(1).mean()
    ```

    ## Stays silent on
    A fixed centre (a tensor without gradient, a buffer); a spread that is one term of
    several (a classification or reconstruction term beside it, DOC's compactness loss with
    its descriptiveness loss); a spread the loss maximises or holds above a floor (negated,
    VICReg's variance hinge); a centred tensor used any other way (a standardisation fed on,
    a covariance); a centred residual of the outputs against data (`err = model(x) - y`,
    `((err - err.mean(0)) ** 2).mean()`: relative energies, fitted up to one constant per
    batch, which the targets keep from collapsing). Not seen: a centre that is a trained parameter (it collapses too), spreads
    written through another op than `mean` over axis 0.
    """

    code = "GD309"
    slug = "loss-is-batch-spread"
    severity = Severity.WARNING
    summary = ("the loss is only the spread of a batch of outputs around their own mean: any "
               "constant output minimises it, so the network collapses")
    fix = ("compute the centre once, before training and without gradient "
           "(with torch.no_grad(): c = encoder(train_x).mean(0)), and pull the outputs to it")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        told: set = set()
        for event in a.by_kind.get("spread_minimised", ()):
            loc = event.loc
            if loc is None or not any(pid in stepped for pid in event.get("params") or ()):
                continue
            where, text = loc, None
            for line in range(loc.line - 1, max(0, loc.line - _WINDOW), -1):
                written = a.source.line_text(loc.path, line).split("#")[0]
                if _CENTRED.search(written):
                    where, text = Location(loc.path, line), written.strip()
                    break
            if (where.path, where.line) in told:
                continue
            told.add((where.path, where.line))
            batch, features = event["shape"]
            what = ("the variance of the batch's outputs" if event["form"] == "var"
                    else "each output's distance to the batch's own mean")
            shown = f"`{text}` makes the loss" if text else "the loss of this backward is"
            yield self.finding(
                f"{shown} nothing but {what} ({batch} samples of {features} features), taken "
                f"with its gradient: a network that maps every input to one point makes it 0, "
                f"so minimising it collapses the outputs instead of fitting the data (a "
                f"one-class centre must be fixed beforehand, without gradient)",
                where,
                related=(related(event, "the backward of that loss"),) if text else (),
                evidence={"form": event["form"], "shape": event["shape"]},
                fix=self.fix)
