from __future__ import annotations

from ..findings import Severity
from .base import Rule


class EntropyMinimised(Rule):
    """
    ## What it does
    Finds an entropy bonus with the wrong sign: a policy's `dist.entropy()` added to the loss
    that is minimised (`loss = policy_loss + c * entropy`) in a loss that also holds a
    score-function `log_prob` (policy gradient, A2C, PPO), or SAC's actor loss with the
    log-probability of its own reparameterised sample subtracted (`-alpha * log_prob(a) - Q`
    for `a = dist.rsample()`). `entropy`, `rsample` and `log_prob` of `torch.distributions` are
    wrapped; at the first backwards of a line the loss's linear top (sums, means, negations,
    constant factors) is walked with each term's sign. It points at the call that made the
    term.

    ## Why is this bad?
    The bonus is there to keep the policy exploring. With the wrong sign the optimizer makes
    the policy as certain as it can, as fast as it can: it stops exploring and settles on
    whatever action looked best in the first batches. The loss falls, the entropy collapses
    and the returns stall.

    ## Example
    ```python
    entropy = dist.entropy().mean()
    loss = policy_loss + 0.5 * value_loss + 0.01 * entropy
    ```

    ## Use instead
    ```python
    loss = policy_loss + 0.5 * value_loss - 0.01 * entropy  # maximise the entropy
    ```

    ## Stays silent on
    `- c * entropy`, `c * (-entropy)`, SAC's `alpha * log_prob(a) - Q`, an entropy minimised
    without any policy-gradient term (entropy minimisation on unlabelled data), a VAE's
    `log_prob` terms of its latent sample under the prior, and terms whose sign goes through a
    product of two computed tensors (not judged).
    """

    code = "GD259"
    slug = "entropy-minimised"
    severity = Severity.WARNING
    summary = ("a policy's entropy is minimised: the entropy bonus enters the loss with the wrong "
               "sign, so the policy is pushed to stop exploring")
    fix = "subtract the entropy bonus from the loss (loss = policy_loss - c * entropy)"

    def check(self, a):
        for event in a.by_kind.get("entropy_sign", ()):
            if event["term"] == "entropy":
                message = (f"the entropy of this {event['dist']} enters the minimised loss with a "
                           f"positive sign, next to a policy-gradient log_prob: the optimizer "
                           f"lowers the policy's entropy, the opposite of an entropy bonus, and the "
                           f"policy stops exploring")
                fix = self.fix
            else:
                message = (f"the log-probability of this {event['dist']}'s own reparameterised "
                           f"sample enters the minimised loss with a negative sign: the loss "
                           f"rewards a lower entropy (SAC's actor minimises alpha * log_prob(a) - Q)")
                fix = ("add the log-probability term with a positive weight: "
                       "actor_loss = (alpha * log_prob - q).mean()")
            yield self.finding(message, event.loc, evidence={"term": event["term"], "dist": event["dist"]},
                               fix=fix)
            return
