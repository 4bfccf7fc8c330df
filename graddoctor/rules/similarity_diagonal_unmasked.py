from __future__ import annotations

from ..findings import Severity
from .base import Rule


class SimilarityDiagonalUnmasked(Rule):
    """
    ## What it does
    Finds a contrastive loss (InfoNCE / NT-Xent, as SimCLR writes it) computed as
    `cross_entropy` over a batch's (N, N) similarity matrix whose diagonal — each sample's
    similarity with itself — is left in: in nearly every row the largest logit sits on the
    diagonal while no label points there. Read from the first calls' values.

    ## Why is this bad?
    A sample's cosine similarity with itself is 1, the largest any pair can have, so after the
    temperature it dominates the softmax of its row: the positive pair can never be the most
    likely, the loss stays high, and the gradient is scaled down by the self-term's weight. The
    self-similarity carries no gradient (it is constant), so the model learns the contrast
    slowly and badly. The other pairs still train, so nothing fails.

    ## Example
    ```python
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / tau
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    loss = F.cross_entropy(logits, labels)
    ```

    ## Use instead
    ```python
    logits = z @ z.T / tau
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    loss = F.cross_entropy(logits, labels)
    ```

    ## Stays silent on
    CLIP-style losses whose labels are the diagonal (`arange(n)`: the diagonal is the positive);
    a masked diagonal; square inputs whose maxima are not on the diagonal (a classifier whose
    batch size equals its class count).
    """

    code = "GD229"
    slug = "similarity-diagonal-unmasked"
    severity = Severity.WARNING
    summary = ("a contrastive cross_entropy over a similarity matrix keeps each sample's "
               "similarity with itself, which outweighs every positive")
    fix = "mask the diagonal before the loss: logits.masked_fill(torch.eye(n, dtype=torch.bool), float('-inf'))"

    def check(self, a):
        for e in a.of_kind("self_match"):
            n = e["size"]
            yield self.finding(
                f"cross_entropy gets a {n}x{n} matrix whose largest logit sits on the diagonal in "
                f"{e['on_diagonal']:.0%} of the rows, while no label points at the diagonal: each "
                f"sample's similarity with itself is left in the softmax, outweighs its positive "
                f"and carries no gradient, so the contrast trains slowly and badly",
                e.loc, evidence={"size": n, "on_diagonal": e["on_diagonal"]})
