from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class MaxIndicesAsValues(Rule):
    """
    ## What it does
    Finds the positions of a maximum used where its value was meant: `q.max(1)[1]` (or
    `.indices`, `argmax`) scaled by a discount and added to a reward to make a Q-learning
    target, or a confidence `probs.max(1)[1]` compared with a threshold like 0.95 (FixMatch's
    pseudo-label mask). Read from the script's source: an index of a `max`/`min`/`topk`/`sort`
    (`[1]`, `.indices`) or an `argmax`, combined with a non-integer float and passed on to a
    loss call, or compared with a threshold between 0 and 1; reported once the script has run
    a backward.

    ## Why is this bad?
    `torch.max(x, dim)` returns `(values, indices)`. The indices are class or action numbers
    (0, 1, 2, ...): a TD target built from them is `r + gamma * action_number`, a regression
    toward integers that have nothing to do with the value of the next state, and a confidence
    mask `index >= 0.95` keeps every sample whose predicted class is not 0 and drops every
    sample of class 0, whatever the confidence. The loss still falls; the model learns the
    wrong quantity.

    ## Example
    ```python
    with torch.no_grad():
        next_q = target_net(next_states).max(1)[1]
        y = rewards + gamma * (1 - dones) * next_q
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        next_q = target_net(next_states).max(1)[0]   # or .max(1).values
        y = rewards + gamma * (1 - dones) * next_q
    ```

    ## Stays silent on
    Indices used as indices (`gather`, indexing, `one_hot`), as labels (`cross_entropy`'s
    target, pseudo-labels), compared with labels (`argmax(1) == y`) or with an integer class
    (`argmax(1) > 0`: foreground); index arithmetic with integers (`idx * n + k`); a value
    decoded from a class index (`idx * 0.1 + lo`) that never reaches a loss; `values, indices
    = x.max(1)` unpacked by name; a name a function assigns (an environment's `obs` made from an
    action number in its `step`) against a name of the same spelling outside it. Not seen: a use
    through a function the positions are passed to, or in another file than the script.
    """

    code = "GD143"
    slug = "max-indices-as-values"
    severity = Severity.WARNING
    summary = ("the positions of a maximum (max(dim)[1], .indices, argmax) are used as its "
               "values: a target or a confidence made of class or action numbers")
    fix = "take the values: `x.max(dim)[0]` or `x.max(dim).values` (`[1]` and `.indices` are the positions)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            for line, text, use, use_line in a.source.indices_as_values(path):
                if use == "threshold":
                    why = (f"it is compared with a probability threshold at line {use_line}: the "
                           f"mask keeps every sample whose predicted class number passes the "
                           f"threshold (every class but 0), whatever the model's confidence")
                else:
                    why = (f"it is scaled by a float and reaches the loss at line {use_line}: the "
                           f"target is built from action or class numbers (0, 1, 2, ...), not "
                           f"from the maximum's value")
                fix = self.fix
                if text.endswith("[1]"):
                    fix = f"`{text[:-3]}[0]` (or `.values`): `[1]` holds the positions"
                elif text.endswith(".indices"):
                    fix = f"`{text[:-len('.indices')]}.values`: `.indices` holds the positions"
                yield self.finding(
                    f"`{text}` is the positions of the maximum (class or action numbers), and "
                    f"{why}",
                    Location(path, line), evidence={"producer": text, "use": use, "use_line": use_line},
                    fix=fix)
