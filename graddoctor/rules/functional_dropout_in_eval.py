from __future__ import annotations

from ..findings import Severity
from .base import Rule


class FunctionalDropoutInEval(Rule):
    """
    ## What it does
    Finds `F.dropout(x, p)` (and `dropout1d/2d/3d`) calls that leave `training` at its
    default, `True`, inside a module that is in eval mode. It points at that call. Calls that
    pass `training=` (`training=self.training`, or `training=True` for deliberate Monte Carlo
    dropout), `nn.Dropout` layers, modules in train mode and `p=0` are not reported.

    ## Why is this bad?
    Unlike `nn.Dropout`, the functional form does not know about `model.eval()`: it keeps
    zeroing activations at evaluation and inference time. Validation metrics and predictions
    become noisy and change from one call to the next, checkpoints are picked on noise, and
    nothing warns about it.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.dropout(x, 0.5)
            return self.fc2(x)
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.dropout(x, 0.5, training=self.training)
            return self.fc2(x)
    ```
    """

    code = "GD304"
    slug = "functional-dropout-in-eval"
    severity = Severity.WARNING
    summary = "F.dropout() without a training argument keeps dropping after model.eval()"
    fix = ("pass training=self.training (F.dropout(x, p, training=self.training)) or use an "
           "nn.Dropout layer; write training=True only if dropout at eval time is intended")

    def check(self, a):
        for e in a.of_kind("dropout_default"):
            fn, p, cls, name = e.get("fn", "dropout"), e.get("p"), e.get("cls", "Module"), e.get("name")
            module = f"{name} ({cls})" if name else cls
            rate = f"{p:.0%} of " if isinstance(p, (int, float)) else ""
            effect = ("its outputs stay random in this gradient-enabled pass too (a part kept in eval "
                      "mode while training still gets dropout)" if e.get("grad") else
                      "validation and inference results are noisy and change from call to call")
            yield self.finding(
                f"F.{fn} here leaves training at its default (True), so it keeps zeroing {rate}the "
                f"activations although {module} is in eval mode: {effect}",
                e.loc,
                step=a.steps_before(e.seq) or None,
                evidence={"function": fn, "p": p, "module": name or cls, "class": cls,
                          "grad": bool(e.get("grad"))},
            )
