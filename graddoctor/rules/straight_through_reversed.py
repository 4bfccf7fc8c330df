from __future__ import annotations

from ..analysis.straight_through import reversed_straight_through
from ..findings import Severity
from ..trace import Location
from .base import Rule


class StraightThroughReversed(Rule):
    """
    ## What it does
    Finds a straight-through estimator written with its signs swapped: a sum that adds a value's
    detached copy and subtracts the value itself (`onehot + probs.detach() - probs`,
    `y_hard - y_soft + y_soft.detach()`), where the estimator adds the value and subtracts the
    copy. Read from the script's source, in the files whose backwards ran: a sum or difference of
    three terms or more (a stop-gradient over a sum, `(a - b).detach()`, spread over its terms;
    `sg(x)`, `stop_gradient(x)` and `x.data` read as `x.detach()`) where a value's only plain
    occurrence is subtracted and its detached copy added.

    ## Why is this bad?
    The trick `hard + soft - soft.detach()` has the forward value of `hard` and the gradient of
    `soft`: the sampled one-hot latent of a Dreamer world model, a rounded or quantised code, a
    Gumbel sample. Swapped, the forward value is the same (the two copies still cancel), so every
    printed number looks right, but the gradient that reaches `soft` is negated: the encoder,
    the posterior or the policy is pushed up the loss it should go down, at every step. The
    model still trains through its other paths and ends worse; nothing fails.

    ## Example
    ```python
    probs = logits.softmax(-1)
    onehot = F.one_hot(probs.argmax(-1), n).float()
    onehot = onehot + probs.detach() - probs
    ```

    ## Use instead
    ```python
    onehot = onehot + probs - probs.detach()
    ```

    ## Stays silent on
    `hard + soft - soft.detach()`, `hard - soft.detach() + soft`, `soft + (hard - soft).detach()`
    and `(hard - soft).detach() + soft`; `F.gumbel_softmax(..., hard=True)`; a two-term
    `x.detach() - x` (a zero whose gradient is wanted negated) and terms with a factor
    (`2 * x.detach() - x`, a gradient reversal).
    """

    code = "GD296"
    slug = "straight-through-reversed"
    severity = Severity.WARNING
    summary = ("a straight-through estimator adds the detached copy and subtracts the value: the "
               "forward is right and the gradient is negated")
    fix = "add the value and subtract its detached copy: `hard + soft - soft.detach()`"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, value in reversed_straight_through(a.source.full(path)):
                yield self.finding(
                    f"`{text}` adds `{value}` detached and subtracts it with its gradient: the "
                    f"forward value is the same as a straight-through estimator's, but every "
                    f"gradient that reaches `{value}` through it is negated",
                    Location(path, line, None),
                    fix=f"add `{value}` and subtract `{value}.detach()`",
                    evidence={"expression": text, "value": value})
