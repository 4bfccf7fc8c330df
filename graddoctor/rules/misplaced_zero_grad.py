from __future__ import annotations

from ..findings import Severity
from .base import Rule, related


class MisplacedZeroGrad(Rule):
    """
    ## What it does
    Finds a clear (`zero_grad`, or `p.grad = None` through `model.zero_grad()`) that throws away
    gradients of the current update before the optimizer step that should use them: zero_grad
    between backward and step, between two losses, or before every micro-batch of an
    accumulation loop. Silent when the dropped backward had another purpose: an input gradient
    (FGSM adversarial examples) or the closure of `optimizer.step(closure)` (L-BFGS).

    ## Why is this bad?
    The step then applies zero or only the last micro-batch's gradient: training silently does
    nothing, or uses 1/k of the batch you think it uses.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()   # clear after the step, at the window's end
    ```
    """

    code = "GD104"
    slug = "misplaced-zero-grad"
    severity = Severity.ERROR
    summary = "zero_grad() discards gradients before the step that should use them"
    fix = "move the clear after optimizer.step() (or before the first backward of the update)"

    def check(self, a):
        groups: dict = {}
        for d in a.ledger.discards:
            groups.setdefault(d.clear.loc, []).append(d)
        for loc, discards in groups.items():
            first = discards[0]
            pids = [d.pid for d in discards]
            dropped = first.contributions[0].backward
            yield self.finding(
                f"this clear discards the gradients of {a.names(pids)} from a backward that no "
                f"step has used yet; the next optimizer step (step {first.later_step_index}) then "
                f"misses them",
                loc,
                related=(related(dropped, "the backward whose gradients are discarded"),
                         related(first.later_step, "the step that should have used them")),
                step=first.later_step_index,
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "discarded_backward_calls": len(first.contributions)},
            )
