from __future__ import annotations

from ..findings import Safety, Severity
from .base import Rule
from ..findings import Edit
from .source import Stmt


class FunctionalDropoutInEval(Rule):
    """
    ## What it does
    Finds dropout that runs in training mode inside a module that is in eval mode, whichever
    way it is called: `F.dropout(x, p)` (and `dropout1d/2d/3d`) leaving `training` at its
    default, `True`; a training flag given and true (`F.dropout(x, p, True)`,
    `F.alpha_dropout(x, p, training=True)`, `torch.dropout(x, p, True)`);
    `F.scaled_dot_product_attention(..., dropout_p=p)` with no `if self.training`; and an
    `nn.Dropout` in train mode that is no submodule of the module calling it
    (`nn.Dropout(p)(x)` built inside `forward`, layers in a plain list). It points at that call.
    `training=self.training`, registered `nn.Dropout` layers, modules in train mode, `p=0` and
    Monte Carlo dropout are not reported: `training=True` written out, a flag or rate whose
    call, module class or surrounding functions say so (`mc`, `bayes`, `uncertainty`,
    `samples`, ...), and a registered dropout layer set back to train mode by hand are taken as
    Monte Carlo dropout.

    ## Why is this bad?
    Unlike a registered `nn.Dropout`, these calls do not follow `model.eval()`: they keep
    zeroing activations (or attention weights) at evaluation and inference time. Validation
    metrics and predictions become noisy and change from one call to the next, checkpoints are
    picked on noise, and nothing warns about it.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.dropout(x, 0.5)
            q, k, v = self.qkv(x).chunk(3, -1)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.dropout(x, 0.5, training=self.training)
            q, k, v = self.qkv(x).chunk(3, -1)
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=0.1 if self.training else 0.0)
    ```
    """

    code = "GD304"
    slug = "functional-dropout-in-eval"
    severity = Severity.WARNING
    summary = "dropout that does not follow model.eval() (F.dropout default, SDPA dropout_p, unregistered nn.Dropout)"
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
            how = e.get("how", "default")
            module = f"{name} ({cls})" if name else cls
            rate = f"{p:.0%} of " if isinstance(p, (int, float)) else ""
            effect = ("its outputs stay random in this gradient-enabled pass too (a part kept in eval "
                      "mode while training still gets dropout)" if e.get("grad") else
                      "validation and inference results are noisy and change from call to call")
            call = fn if fn.startswith(("torch.", "nn.")) else f"F.{fn}"
            fix = None
            if how == "sdpa":
                message = (f"F.scaled_dot_product_attention here gets dropout_p={p:g} although "
                           f"{module} is in eval mode (SDPA has no training argument), so it keeps "
                           f"dropping {rate}the attention weights: {effect}")
                fix = ("pass the rate only in training: dropout_p=self.dropout if self.training else "
                       "0.0; write a rate at evaluation time only if dropout is meant there (Monte "
                       "Carlo dropout)")
            elif how == "unregistered":
                holder = name or cls
                message = (f"this {call.removeprefix('nn.')} is in train mode although {module} is in "
                           f"eval mode: it is no submodule of {holder} (built inside forward, or held "
                           f"in a plain list or dict), so {holder}.eval() never reaches it and it "
                           f"keeps zeroing {rate}the activations: {effect}")
                fix = ("create the layer once in __init__ as an attribute (self.drop = nn.Dropout(p); "
                       "nn.ModuleList for several) so that eval() reaches it, or call "
                       "F.dropout(x, p, training=self.training)")
            elif how == "explicit":
                message = (f"{call} here is called with training true although {module} is in eval "
                           f"mode, so it keeps zeroing {rate}the activations: {effect}")
                fix = ("pass training=self.training; if dropout at evaluation time is meant (Monte "
                       "Carlo dropout), say so with a flag of its own (training=self.training or "
                       "self.mc_dropout)")
            else:
                message = (f"{call} here leaves training at its default (True), so it keeps zeroing "
                           f"{rate}the activations although {module} is in eval mode: {effect}")
            yield self.finding(
                message, e.loc, fix=fix,
                step=a.steps_before(e.seq) or None,
                evidence={"function": fn, "p": p, "module": name or cls, "class": cls,
                          "grad": bool(e.get("grad")), "how": how},
            )
