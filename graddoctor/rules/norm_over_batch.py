from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class NormOverBatch(Rule):
    """
    ## What it does
    Finds a norm meant per sample taken over the batch and then pulled toward a fixed value: a
    WGAN-GP gradient penalty written `(g.norm(2, dim=0) - 1) ** 2` or `(g.norm(2) - 1) ** 2` on
    a (batch, ...) input gradient, a one-sided Lipschitz penalty `relu(norm - 1)`, a ring loss
    `(feats.norm(dim=0) - R) ** 2`, a norm written out as `sqrt((g ** 2).sum(0))`. Seen in the
    graph of the first backwards, and of a later training phase's (a fine-tuning stage's): the
    norm reduces axis 0 of a tensor whose axis 0 is as long as the data the graph read (and the
    DataLoader's batch), its result is shifted by a constant or a single number and squared,
    taken `abs` or `relu` of, clamped, or given to a regression loss. Reported at the norm's
    call (in a later phase, the one norm call of the script whose value reaches that backward).

    ## Why is this bad?
    Over axis 0 the norm mixes the samples: each value is one feature's norm across the
    batch, or the whole batch's, and it grows with the square root of the batch size. The
    penalty pulls that batch-dependent number toward its target while no sample's own norm is
    constrained — the critic is not kept 1-Lipschitz, the features are not put on the ring —
    and the strength of the constraint changes with the batch size. Nothing fails.

    ## Example
    ```python
    g = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)[0]   # (N, D)
    gp = ((g.norm(2, dim=0) - 1) ** 2).mean()
    ```

    ## Use instead
    ```python
    gp = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()      # one norm per sample
    ```

    ## Stays silent on
    A norm per sample (over the axes after the batch); a norm over the batch that is the loss
    itself (a PINN's residual norm) or a normaliser (`F.normalize(z, dim=0)` before Barlow
    Twins' cross-correlation); a standard deviation or an RMS over the batch pulled above 1
    (VICReg's variance term: a mean inside the root, meant over the batch); a column-norm
    penalty on a weight whose first axis happens to be as long as the batch (no data below
    it).
    """

    code = "GD189"
    slug = "norm-over-batch"
    severity = Severity.WARNING
    summary = ("a norm meant per sample is taken over the batch axis and pulled toward a fixed "
               "value: it mixes the samples and scales with the batch size")
    fix = "take the norm per sample: `x.flatten(1).norm(2, dim=1)` (or `dim=1` for (N, D) values)"

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("norm_batch", ()):
            loc = event.loc
            if loc is not None and event.get("at_backward"):
                loc = self._norm_call(a, loc)  # a later phase's graph, read alone
            if loc is None or (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
            shown = f"`{text}`" if text else "this line"
            shape = "×".join(str(s) for s in event["shape"])
            over = ("every axis" if event["dims"] is None or len(event["dims"]) == len(event["shape"])
                    else "axis 0")
            penalty = event["penalty"]
            how = (f"compared with a target by {penalty}" if penalty.endswith("_loss")
                   else f"shifted by a constant and penalised ({penalty})")
            yield self.finding(
                f"{shown} takes a norm over {over} of a {shape} tensor, whose axis 0 holds the "
                f"{event['batch']} samples, and the result is {how}: the norm mixes the samples "
                f"and grows with the square root of the batch size, so the penalty constrains "
                f"no sample's own norm and its strength depends on the batch size",
                loc, evidence={"shape": event["shape"], "dims": event["dims"],
                               "batch": event["batch"], "penalty": penalty},
                fix=("take the norm per sample, over its features: `dim=1`" if len(event["shape"]) == 2
                     else self.fix))

    @staticmethod
    def _norm_call(a, backward):
        """The one norm or sqrt call of the script whose value reaches the backward at
        ``backward`` (a later phase's finding, read from its graph alone); None when the source
        shows none or several: the line to change is not known."""
        calls = [line for line, _text, _fwd in a.source.calls_named(backward.path, _NORM_CALLS)
                 if a.source.value_reaches_backward(backward.path, line) == backward.line]
        if len(calls) != 1:
            return None
        return Location(backward.path, calls[0], backward.function, backward.via, backward.hook)


_NORM_CALLS = frozenset({"norm", "vector_norm", "sqrt"})
