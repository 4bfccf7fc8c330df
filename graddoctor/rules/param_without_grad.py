from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

MIN_STEPS = 2  # fewer steps are not enough evidence that a parameter never gets a gradient


class ParamWithoutGrad(Rule):
    """
    ## What it does
    Finds parameters an optimizer owns (and that still require grad) that never receive a
    gradient over the whole replay: no backward reaches them and their `.grad` stays `None` at
    every step.

    ## Why is this bad?
    Usually a layer defined in `__init__` but not used in `forward`, or a loss that is detached
    from part of the model. Those weights stay at their initial values. If the layer is only
    used on some inputs (mixture-of-experts, rare branches), a short replay may miss it: then
    ignore this finding for that layer.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.extra = nn.Linear(8, 8), nn.Linear(8, 8)
        def forward(self, x):
            return self.body(x)          # self.extra is never used
    ```

    ## Use instead
    ```python
        def forward(self, x):
            return self.extra(torch.relu(self.body(x)))
    ```
    """

    code = "GD106"
    slug = "param-without-grad"
    severity = Severity.WARNING
    summary = "an optimizer owns parameters that never receive a gradient"
    fix = "use the layer in forward(), remove it, or freeze it with requires_grad_(False)"

    def check(self, a):
        led = a.ledger
        params = a.params
        for opt, init in a.optimizers.items():
            steps = [s for s in a.steps if s["opt"] == opt and not s.get("skipped")]
            if len(steps) < MIN_STEPS:
                continue
            had_grad = set()
            for s in steps:
                had_grad.update(set(a.opt_params[opt]) - set(s.get("without_grad", ())))
            idle = [pid for pid in dict.fromkeys(a.opt_params[opt])
                    if pid not in led.first_contribution and pid not in had_grad
                    and (params.get(pid) is None or params[pid].get("requires_grad", True))]
            if idle:
                yield self.finding(
                    f"{a.names(idle)} are owned by this {init.get('cls', 'optimizer')} but got no "
                    f"gradient in {len(steps)} steps: they never train",
                    init.loc,
                    related=(related(steps[0], "a step that finds them without gradient"),),
                    evidence={"params": [a.param_name(p) for p in idle], "steps": len(steps),
                              "optimizer": opt},
                )
