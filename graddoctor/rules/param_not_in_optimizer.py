from __future__ import annotations

from ..findings import Severity
from .base import Rule, related


class ParamNotInOptimizer(Rule):
    """
    ## What it does
    Finds parameters (`nn.Parameter`) that receive gradients but that no optimizer owns. When
    the script has no `torch.optim` optimizer at all (hand-written SGD), it says once, as
    `info`, that the zero_grad checks cannot judge the loop.

    ## Why is this bad?
    Those layers never train although backward spends time on them: usually a module added
    after the optimizer was built, or an optimizer built from `model.backbone.parameters()`
    while the loss also flows through `model.head`.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.backbone.parameters(), lr=1e-3)
    loss_fn(model.head(model.backbone(x)), y).backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # or, when the head is meant to stay fixed:
    model.head.requires_grad_(False)
    ```
    """

    code = "GD105"
    slug = "param-not-in-optimizer"
    severity = Severity.WARNING
    summary = "parameters receive gradients but no optimizer updates them"
    fix = ("pass every trained parameter to the optimizer (model.parameters()), or freeze the "
           "others with requires_grad_(False)")
    fixes = {
        "lightning": ("in configure_optimizers, build the optimizer over self.parameters() (or "
                      "give each part its param group), or freeze the others in __init__ with "
                      "requires_grad_(False)"),
        "accelerate": ("create the optimizer over every trained parameter (model.parameters()) "
                       "before accelerator.prepare, or freeze the others with requires_grad_(False)"),
    }

    def check(self, a):
        led = a.ledger
        params = a.params
        if not a.optimizers:
            if a.backward_calls:
                first = a.of_kind("backward")[0]
                yield self.finding(
                    "no torch.optim optimizer was seen: graddoctor cannot tell which gradients an "
                    "update uses, so the zero_grad checks are limited for this script",
                    first.loc, severity=Severity.INFO,
                    fix="nothing to fix if the update is written by hand on purpose",
                    evidence={"backward_calls": a.backward_calls},
                )
            return
        orphans = [pid for pid in led.first_contribution
                   if pid not in a.owners and params.get(pid) is not None
                   and params[pid].get("is_parameter")]
        if not orphans:
            return
        construction = next(iter(a.optimizers.values()))
        yield self.finding(
            f"{a.names(orphans)} receive gradients but no optimizer owns them: they never train",
            construction.loc,
            related=(related(led.first_contribution[orphans[0]], "the backward that gives them gradients"),),
            evidence={"params": [a.param_name(p) for p in orphans], "count": len(orphans)},
        )
