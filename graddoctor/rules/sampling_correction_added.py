from __future__ import annotations

from ..analysis.sampling_correction import corrections_added
from ..findings import Severity
from ..trace import Location
from .base import Rule


class SamplingCorrectionAdded(Rule):
    """
    ## What it does
    Finds a sampled softmax whose log sampling probability (the logQ correction) is added to
    the scores instead of subtracted: `logits + log_q`, `scores + torch.log(q[items])`,
    `logits += log_sampling_prob`, `sim.add(log_expected_count)`. Read from the script's
    source, in the files whose backwards ran: a sum one side of which is named as a log
    sampling probability (`log_q`, `logq`, a log of `q`, of a sampling probability or of an
    expected count) and the other side, or the name it is assigned to, as scores (`logits`,
    `scores`, `sim`, `dot`, `ratings`).

    ## Why is this bad?
    In-batch negatives and popularity-sampled candidates show the softmax each item at its
    sampling rate Q, so the sampled loss is biased toward pushing popular items down; the
    correction `logits - log Q` takes that rate back out. Added, it doubles the bias instead of
    removing it: popular items are penalised twice over, the model ranks rare items above the
    ones users engage with, and nothing fails: the loss falls as usual.

    ## Example
    ```python
    logits = user_vec @ item_vecs.T
    logits = logits + log_q[item_ids]
    loss = F.cross_entropy(logits, torch.arange(len(logits)))
    ```

    ## Use instead
    ```python
    logits = logits - log_q[item_ids]
    ```

    ## Stays silent on
    The correction subtracted (`logits - log_q`), or added as a name that holds its sign
    (`neg_log_q`, `minus_log_q`); a log prior added on purpose (the logit-adjusted loss's
    `logits + tau * log(prior)`, class frequencies); sums whose sides name no scores; files
    whose backwards did not run.
    """

    code = "GD349"
    slug = "sampling-correction-added"
    severity = Severity.WARNING
    summary = ("a sampled softmax adds the log sampling probability to its scores instead of "
               "subtracting it: popular candidates are penalised twice")
    fix = "subtract the log sampling probability from the scores: `logits - log_q`"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, correction in corrections_added(a.source.full(path)):
                yield self.finding(
                    f"`{text}` adds the log sampling probability `{correction}` to the scores: "
                    f"the logQ correction is subtracted (`logits - log Q`), so that candidates "
                    f"sampled often are not pushed down for being seen often; added, their "
                    f"sampling rate is counted twice and the model learns to rank rare items "
                    f"above popular ones",
                    Location(path, line, None),
                    fix=(f"subtract it: `-=` for `+=`" if "+=" in text else
                         f"subtract it: replace the `+` before `{correction}` with `-`"),
                    evidence={"correction": correction})
