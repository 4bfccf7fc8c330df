from __future__ import annotations

import re

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


# a reciprocal written out in the statement: `1.0 / batch_size`, `1 / len(x)`, `1. / x.size(0)`
_RECIPROCAL = re.compile(r"(?<![\w.])1(?:\.0*)?\s*/\s*[A-Za-z_(]")


class LossTermsMixedReduction(Rule):
    """
    ## What it does
    Finds a loss that adds two terms computed from the same per-sample activations, one
    summed over the batch and the other averaged over it: a VAE whose KL is
    `torch.sum(...)` over the whole batch next to a mean reconstruction, an auxiliary loss
    built with `reduction="sum"` next to a mean main loss, an activation penalty
    `h.abs().sum()` next to a mean cross-entropy, a per-sequence loss summed over the batch
    next to a per-token mean. It is read from the loss's autograd graph at the first
    backwards: for each term of its additive top, which reduction took the batch axis (a mean,
    a loss's `reduction="mean"`, or a sum divided by a multiple of the batch size count as
    averaged). It points at the summed term's assignment when the backward's frame holds it.
    The same holds for a sum over the batch added to every sample's value before the mean: a
    flow's log-det `s.sum()` where `s.sum(dim=1)` was meant, in `-(log_pz + log_det).mean()`,
    or `(recon + kl.sum()).mean()`. The mean of a value repeated in every row is that value,
    so the batch total keeps its whole weight; the finding then points at the script's one sum
    over every axis when there is one.

    ## Why is this bad?
    A summed term grows with the batch size, an averaged one does not: their relative weight
    is the written weight times the batch size. At batch 32 a `beta = 4` KL weighs 128 times
    the reconstruction's per-sample scale, and changing the batch size silently retunes the
    balance (and the step size of that term). The weights tuned at one batch size do not hold
    at another, and the loss's two parts do not mean what the script says.

    ## Example
    ```python
    recon = F.mse_loss(x_hat, x, reduction="sum") / x.size(0)
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    loss = recon + beta * kl
    ```

    ## Use instead
    ```python
    recon = F.mse_loss(x_hat, x, reduction="sum") / x.size(0)
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.size(0)
    loss = recon + beta * kl
    ```

    ## Stays silent on
    Both terms summed over the batch (the PyTorch VAE example) or both averaged; a sum divided
    by the batch size or by the number of elements, also several sums divided as a whole
    (BPR's `(eu.pow(2).sum() + ep.pow(2).sum()) / batch_size`); a KL summed over the latent dimensions and
    then averaged over the batch (`kl.sum(1).mean()`); penalties on parameters
    (`sum(p.pow(2).sum() ...)`, even when a weight has as many rows as the batch); sums over
    other axes (a covariance's feature pairs); terms with no per-sample activation in common
    (real and fake batches of a discriminator, each averaged); a sum divided by a count the
    script computed (`/ mask.sum()`, `/ num_items_in_batch`); a sum of values times weights
    that add up to 1 (a weighted mean); a mean over an (N, N) matrix of pairs (an MMD kernel).
    A product by a constant that is exactly 1 / N where the statement writes it as a
    reciprocal (`1.0 / batch_size`, `1 / len(x)`) is a mean over the batch (TRADES'
    `(1.0 / batch_size) * kl_sum`); any other constant factor is read as a weight (`5e-3 *
    off_diagonal`, `0.125 * h.abs().sum()` at batch 8), whatever its reciprocal. Inside a mean: a per-sample log-det
    (`s.sum(dim=1)`), an ActNorm's log-det summed over its own parameter (one value for every
    sample), a value centred by the batch's mean (`r - r.mean()`), a weight penalty added to
    every row; a coupling layer's 0/1 feature mask that adds up to 1 is no weighted mean.
    """

    code = "GD182"
    slug = "loss-terms-mixed-reduction"
    severity = Severity.WARNING
    summary = ("the loss adds a term summed over the batch to a term averaged over it: their "
               "balance changes with the batch size")
    fix = "divide the summed term by the batch size (or sum the other term as well)"

    def check(self, a):
        for e in a.of_kind("batch_reduction"):
            if e.get("broadcast"):
                yield self._broadcast(a, e)
                continue
            loc, text = e.loc, None
            name, other = e.get("summed_name"), e.get("averaged_name")
            if loc is not None:
                found = a.source.term_assignment(loc.path, loc.line, name) if name else None
                if found is None:
                    found = a.source.loss_assignment(loc.path, loc.line)
                if found is not None:
                    loc, text = Location(loc.path, found[0]), found[1]
            n, rows = e.get("batch"), e.get("averaged_rows")
            if e.get("times_reciprocal") and text and _RECIPROCAL.search(text):
                continue  # `(1.0 / batch_size) * kl_sum`: a mean written as a product
            summed = f"`{name}`" if name else "one term"
            averaged = f"`{other}`" if other else "another"
            per = "its samples" if rows == n else "its tokens"
            yield self.finding(
                f"the loss backpropagated at line {e.loc.line if e.loc else '?'} adds {summed}, "
                f"summed over the batch ({e.get('summed')} over {n} samples), to {averaged}, "
                f"averaged over {per} ({e.get('averaged')}): the summed term grows with the "
                f"batch size and the averaged one does not, so their balance is the written "
                f"weight times {n} here and changes whenever the batch size does",
                loc, step=a.next_step_number(e.seq),
                evidence={"summed": e.get("summed"), "averaged": e.get("averaged"), "batch": n,
                          "averaged_rows": rows, "line": text},
                fix=self._fix(name))

    def _broadcast(self, a, e):
        """A sum over the batch added to every sample's value, then averaged (``log_det +
        s.sum()`` where ``s.sum(dim=1)`` was meant): the line of the sum when the script holds
        one sum over all axes, else the assignment of the per-sample value that holds it."""
        loc, text, related = e.loc, None, []
        name, n = e.get("summed_name"), e.get("batch")
        sums = a.source.full_sums(loc.path) if loc is not None else []
        if loc is not None and name:
            found = a.source.term_assignment(loc.path, loc.line, name)
            if found is not None:
                related.append(Related(Location(loc.path, found[0]), f"`{name}`, which holds the sum in every row"))
        if len(sums) == 1:
            loc, text = Location(loc.path, sums[0][0]), sums[0][1]
        elif related:
            loc = related.pop().location
        where = f"`{text}`" if text else "a sum over every axis"
        holder = f"`{name}`, one value per sample," if name else "every sample's value,"
        return self.finding(
            f"{where} reduces the batch axis too ({e.get('summed')} over {n} samples), and the "
            f"scalar it gives is added to {holder} which the loss "
            f"backpropagated at line {e.loc.line if e.loc else '?'} then averages over the batch "
            f"({e.get('averaged')}): the same batch total sits in every row, so the mean leaves "
            f"it whole — that term weighs {n} times what the per-sample terms beside it do, and "
            f"each sample's value holds the other samples' parts",
            loc, step=a.next_step_number(e.seq), related=related,
            evidence={"summed": e.get("summed"), "averaged": e.get("averaged"), "batch": n,
                      "averaged_rows": e.get("averaged_rows"), "line": text, "broadcast": True},
            fix=("reduce only the per-sample axes, so that each sample keeps its own value "
                 "(`s.sum(dim=1)`, `kl.sum(dim=-1)`), then let the mean over the batch average it"))

    def _fix(self, name) -> str:
        if name:
            return (f"divide `{name}` by the batch size (`... / x.size(0)`), or reduce the other "
                    f"term with a sum too, so that both scale alike with the batch")
        return self.fix
