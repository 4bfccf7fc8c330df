from __future__ import annotations

from ..analysis.greedy_q import greedy_q_predictions
from ..findings import Severity
from ..trace import Location
from .base import Rule


class GreedyQTrained(Rule):
    """
    ## What it does
    Finds a Q-learning loss whose prediction is the maximum of the online network's Q-values over
    the actions (`chosen = q.max(dim=2)[0]`, `pred = torch.max(q_values, 1)[0]`) where it should
    be the Q-value of the action taken (`q.gather(-1, actions)`). Read from the script's source,
    in the files whose backwards ran: an assignment outside `no_grad` of the values of a `max`
    over an axis after the batch's (a literal dim other than 0, no `keepdim`) of a value named as
    Q-values, neither it nor the assigned name a bootstrap side (`next`, `target`, `tgt`,
    `best`...), no `.detach()`, whose name (or a name computed from it, a mixer's output) reaches
    a loss call or a loss or TD-error name later in the same function.

    ## Why is this bad?
    A TD target `r + gamma * max_a' Q_target(s', a')` is the value of the action that was taken
    in `s`: the loss must regress `Q(s, a_taken)` onto it. Regressed with `max_a Q(s, a)`, the
    actions in the batch never enter the loss: only the currently greedy action's value is
    trained, every other action keeps its initial (or drifting) value, and the greedy choice
    locks onto whatever action started highest. The TD error still falls, so nothing looks
    wrong; the policy stops improving after its first choices.

    ## Example
    ```python
    q = agent(obs)                                   # (batch, agents, actions)
    chosen = q.max(dim=2)[0]
    q_tot = mixer(chosen, state)
    loss = F.mse_loss(q_tot, y)
    ```

    ## Use instead
    ```python
    chosen = q.gather(2, actions.unsqueeze(-1)).squeeze(-1)
    ```

    ## Stays silent on
    The maximum in the bootstrap side (a target or next-state name, or under `no_grad`, or
    detached); a maximum over the batch axis or with `keepdim` (a log-sum-exp's stabiliser);
    maxima of values not named as Q-values (logits, scores) and ones that reach no loss.
    """

    code = "GD300"
    slug = "greedy-q-trained"
    severity = Severity.WARNING
    summary = ("a Q-learning loss regresses the maximum over the actions, not the Q-value of the "
               "action taken: the actions in the batch never enter the loss")
    fix = "pick the taken action's Q-value: `q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)`"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, qname, loss_line in greedy_q_predictions(a.source.full(path)):
                yield self.finding(
                    f"`{text}` takes the maximum of `{qname}` over the actions as the prediction "
                    f"that reaches the loss at line {loss_line}: the TD target is the value of the "
                    f"action taken, so only the greedy action's Q-value is trained and the actions "
                    f"in the batch never enter the loss",
                    Location(path, line, None),
                    fix=(f"gather the taken action's Q-value: `{qname}.gather(-1, "
                         f"actions.unsqueeze(-1)).squeeze(-1)` (the max belongs to the target's "
                         f"next-state side)"),
                    evidence={"statement": text, "q": qname, "loss_line": loss_line})
