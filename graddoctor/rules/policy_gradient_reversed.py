from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

_CRITIC = {"mse_loss": "`mse_loss` of the value", "smooth_l1_loss": "`smooth_l1_loss` of the value",
           "huber_loss": "`huber_loss` of the value", "l1_loss": "`l1_loss` of the value",
           "gaussian_nll_loss": "`gaussian_nll_loss` of the value", "square": "squared difference"}


# the names that say the weight is a reward's (an advantage, a return, a TD error), and those
# that say it is a cost's (REINFORCE on a tour length minimises (cost - baseline) * log_prob)
_REWARD_WORDS = ("adv", "return", "reward", "gae", "delta", "td_")
_COST_WORDS = ("cost", "length", "penalt", "regret")


def _says_reward(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in _REWARD_WORDS) and not any(w in low for w in _COST_WORDS)


class PolicyGradientReversed(Rule):
    """
    ## What it does
    Finds an actor-critic's policy-gradient term with the wrong sign: the loss minimises
    `log_prob(a) * advantage` (the minus in front of the actor's loss forgotten) while the
    advantage is the return minus the critic's value, or maximises `log_prob(a) * (value -
    return)` (the difference written the other way round). `log_prob` of `torch.distributions`
    is wrapped; at the first 3 backwards of each backward line after log-probabilities, the
    loss's linear top (sums, means, stacks, views, negations, constant factors) is walked with
    each term's sign to the products of a log-probability and a weight without gradient, and to
    the critic's regression in the same loss (`mse_loss`, `smooth_l1_loss`, `huber_loss`,
    `l1_loss`, `gaussian_nll_loss` of a value with gradient on a return without one, or
    `(returns - values) ** 2`), which says which
    side is the return. A weight equal to `R - V` (or correlated 0.98 or more element by
    element: a normalised advantage; for one number per step, `-log_prob * (R - value.item())`,
    the same values) is oriented as a reward. The graph says which side is the critic's value,
    not whether the return is a reward or a cost, so the rule speaks only when the script's line
    that makes the policy-gradient term names its weight a reward's (an advantage, a return, a
    reward, GAE, a TD error) and no cost's. It points at that line, or, for a difference written
    the other way round, at the assignment of the advantage. Without a critic, a REINFORCE is
    found the same way when its weights (the returns) are never negative and not all one value,
    and the loss minimises their product with the log-probabilities: log-probabilities from
    `torch.distributions` or picked from a `log_softmax` over its last axis
    (`F.log_softmax(logits, -1).gather(1, actions)`), the line naming the weight a reward's.

    ## Why is this bad?
    The policy gradient raises the log-probability of each action in proportion to its
    advantage: the actions that did better than the critic expected become likelier. The actor's
    loss is therefore `-(log_prob * advantage)`. Minimised with a positive sign, the optimizer
    lowers the probability of exactly the actions that did better and raises the others': the
    policy learns to do worse, the loss goes down all the same, and the critic (trained
    correctly) keeps tracking the falling returns, so nothing looks broken but the reward.

    ## Example
    ```python
    advantage = returns - values
    actor_loss = (log_probs * advantage.detach()).mean()
    critic_loss = advantage.pow(2).mean()
    loss = actor_loss + 0.5 * critic_loss - 0.01 * entropy
    ```

    ## Use instead
    ```python
    actor_loss = -(log_probs * advantage.detach()).mean()
    ```

    ## Stays silent on
    `-(log_prob * (R - V).detach())` in any written form (a negated mean, a stack of per-step
    `-log_prob * advantage`, a normalised advantage); a weight oriented as a cost
    (`log_prob * (V - R)` minimised; REINFORCE on a cost with a learned baseline, the routing
    attention model's `((cost - bl_val) * log_likelihood).mean()` next to `mse_loss(bl_val,
    cost)`: the graph reads R - V there too, the names say R is a cost); a REINFORCE without a
    critic whose returns take both signs (a baseline subtracted, standardised returns) or are
    named a cost's (`(tour_cost * log_prob).mean()`), a log-likelihood weighted by positive
    importance weights with its minus; weights symmetric around zero (both orientations fit); PPO's clipped surrogate (`surrogate-minimised`'s); an advantage that
    still carries gradient (`advantage-not-detached`'s). Not seen: the actor's and the critic's
    losses backpropagated separately (the critic is not in the actor's graph), a critic's
    advantage beside log-probabilities made without `torch.distributions`, a REINFORCE whose
    weight is named neither a reward's nor a cost's (`score`), tensors on an accelerator.
    """

    code = "GD317"
    slug = "policy-gradient-reversed"
    severity = Severity.WARNING
    summary = ("the policy-gradient term minimises log_prob * advantage: the optimizer lowers the "
               "probability of the actions that did better than the critic expected")
    fix = "negate the policy-gradient term: actor_loss = -(log_prob * advantage.detach()).mean()"

    def check(self, a):
        for event in a.of_kind("policy_sign"):
            backward = event.loc
            if backward is None:
                continue
            line = a.source.policy_term_line(backward.path, backward.line)
            if line is None or not _says_reward(line[1]):
                continue  # the graph knows R - V, not whether R is a reward or a cost
            loc, text = Location(backward.path, line[0], backward.function), line[1]
            if event["weight"] == "cost":
                made = a.source.advantage_line(backward.path, backward.line)
                if made is not None:
                    loc, text = Location(backward.path, made[0], backward.function), made[1]
            shown = f"`{text}`"
            if event["critic"] == "none":
                yield self.finding(
                    f"{shown} multiplies the log-probability of the chosen actions by returns that "
                    f"are all zero or positive, with no critic or baseline, and the loss minimises "
                    f"that product: the optimizer lowers the probability of every action taken, "
                    f"the better-rewarded ones most, so the policy moves away from what earned "
                    f"reward while the loss falls",
                    loc, fix=("negate the policy-gradient term: loss = -(log_prob * returns).sum() "
                              "(or .mean()), and subtract a baseline to lower its variance"),
                    evidence={k: event[k] for k in ("dist", "critic", "weight", "sign")})
                continue
            critic = _CRITIC.get(event["critic"], "regression of the value")
            if event["weight"] == "advantage":
                how = (f"multiplies the log-probability by the return minus the critic's value (the "
                       f"critic's {critic} in the same loss says which side is which) and the "
                       f"loss minimises that product")
                fix = self.fix
            else:
                how = (f"multiplies the log-probability by the critic's value minus the return (the "
                       f"critic's {critic} in the same loss says which side is which) and the "
                       f"loss maximises that product")
                fix = ("weight the log-probability by the return minus the value, or keep the "
                       "difference and drop the minus in front of the term")
            yield self.finding(
                f"{shown} {how}: the optimizer lowers the probability of the actions that did "
                f"better than the critic expected and raises the others', so the policy gets "
                f"worse while the loss falls",
                loc, fix=fix,
                evidence={k: event[k] for k in ("dist", "critic", "weight", "sign")})
