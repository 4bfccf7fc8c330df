from __future__ import annotations

from ..findings import Safety, Severity
from .base import Rule
from ..findings import Edit
from .source import Stmt


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

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``training=self.training`` on the functional dropout call of a module's method."""
        cst = src.cst
        s = src.statement_at(finding.location.line)
        fn = src.enclosing_function(s) if s is not None else None
        if fn is None:
            return None
        params = fn.node.params.params
        if not params or params[0].name.value != "self":
            return None
        fn_name = str(finding.evidence.get("function") or "dropout").split(".")[-1]
        calls = [c for c in src.nodes(cst.Call, within=s)
                 if src.code(c.func).split(".")[-1] == fn_name]
        if len(calls) != 1:
            return None
        call = calls[0]
        kw = [a for a in call.args if a.keyword is not None and a.keyword.value == "training"]
        if kw:
            return self.edit("follow the module's mode: training=self.training",
                             src.replace(kw[0].value, "self.training"))
        last = call.args[-1] if call.args else None
        if last is None:
            return None
        _, _, line, col = src.span(last.value)
        end = last.comma if isinstance(last.comma, cst.Comma) else None
        text = " training=self.training" if end is not None else ", training=self.training"
        if end is not None:
            _, _, line, col = src.span(end)
        return self.edit("follow the module's mode: training=self.training",
                         Edit(src.path, line, col, line, col, text))

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
