from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class TwinCriticsMaximised(Rule):
    """
    ## What it does
    Finds a TD target built from the larger of twin critics' estimates: `torch.max(q1, q2)`,
    `torch.maximum(q1, q2)`, or a max over `torch.stack([q1, q2])`/`torch.cat`, in a statement
    that discounts it (`r + gamma * ...`) or whose result a statement of the same function
    discounts within the next 10 lines. Twins are two expressions that differ only by the digit
    1 and 2 (or 0 and 1) and name a Q or a critic (`qf1_next_target`/`qf2_next_target`,
    `q1_t(s2)`/`q2_t(s2)`, `qs[0]`/`qs[1]`). Read from the script's source, in the files whose
    backwards ran.

    ## Why is this bad?
    TD3 and SAC keep two critics to fight the overestimation that bootstrapping from a max
    creates: the target takes the smaller estimate (clipped double Q). Taking the larger one
    does the reverse: every target is the more optimistic of two noisy estimates, the error
    compounds through the bootstrap, the critics' values drift upward without bound and the
    actor chases the overestimated actions. Nothing fails; the critic loss can even look fine.

    ## Example
    ```python
    min_qf_next_target = torch.max(qf1_next_target, qf2_next_target) - alpha * next_log_pi
    next_q_value = rewards + (1 - dones) * gamma * min_qf_next_target
    ```

    ## Use instead
    ```python
    min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_log_pi
    ```

    ## Stays silent on
    `torch.min`/`torch.minimum` of twin critics and a min over their stack (REDQ's subset); a
    convex mix of the min and the max of the twins in one statement (BCQ's `lmbda * torch.min(q1,
    q2) + (1 - lmbda) * torch.max(q1, q2)`); a
    max over actions of one critic (DQN's `q.max(1)`); a max of twin critics that no discounted
    statement reads (a logged upper bound); max over expressions that are not twins
    (`torch.max(q, baseline)`).
    """

    code = "GD293"
    slug = "twin-critics-maximised"
    severity = Severity.WARNING
    summary = ("a TD target takes the larger of twin critics' estimates: the bootstrap overestimates "
               "instead of being clipped")
    fix = "take the smaller estimate (clipped double Q): torch.min of the twin critics"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, maximum in a.source.twin_critics_maximised(path):
                minimum = maximum.replace("maximum(", "minimum(", 1) if "maximum(" in maximum \
                    else maximum.replace("max(", "min(", 1).replace("amax(", "amin(", 1)
                yield self.finding(
                    f"`{text}` bootstraps from `{maximum}`, the larger of twin critics' estimates: "
                    f"each target is the more optimistic of two noisy values, so the overestimation "
                    f"the twin critics are there to cut compounds through every bootstrap",
                    Location(path, line, None), fix=f"take the smaller estimate: `{minimum}`",
                    evidence={"maximum": maximum})
