from __future__ import annotations

from ..findings import Edit, Safety, Severity
from .base import Rule
from .source import torch_nn

# the dropout modules and the functions that do their work
_FUNCTIONAL = {"Dropout": "dropout", "Dropout1d": "dropout1d", "Dropout2d": "dropout2d",
               "Dropout3d": "dropout3d", "AlphaDropout": "alpha_dropout",
               "FeatureAlphaDropout": "feature_alpha_dropout"}


def _calls(cst, node) -> list:
    found = []

    class Visit(cst.CSTVisitor):
        def visit_Call(self, c):
            found.append(c)

    node.visit(Visit())
    return found


def _append_argument(src, last, text: str) -> Edit:
    """An argument added after the call's last one (after its trailing comma if it has one)."""
    cst = src.cst
    _, _, line, col = src.span(last.value)
    end = last.comma if isinstance(last.comma, cst.Comma) else None
    if end is not None:
        _, _, line, col = src.span(end)
        return Edit(src.path, line, col, line, col, f" {text}")
    return Edit(src.path, line, col, line, col, f", {text}")


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
    Monte Carlo dropout. A run cut before the script evaluates (its evaluation after the
    training loop) sees a default call only in train mode: it is reported when the source puts
    a model in eval mode (`model.eval()` in the call's file or a file a backward ran from, no
    `.train()` right after it) and neither the call's line nor an `if` around it reads
    `training`.

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

    ## Stays silent on
    `training=self.training`; `dropout_p=p if self.training else 0.0`; torch's and
    transformers' attention; Monte Carlo dropout (`training=True` written out, a flag named
    for sampling, registered dropout layers set back to train by hand); `F.dropout` used
    only in train mode.
    """

    code = "GD304"
    slug = "functional-dropout-in-eval"
    severity = Severity.WARNING
    summary = "dropout that does not follow model.eval() (F.dropout default, SDPA dropout_p, unregistered nn.Dropout)"
    fix = ("pass training=self.training (F.dropout(x, p, training=self.training)) or use an "
           "nn.Dropout layer; write training=True only if dropout at eval time is intended")

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Each way the dropout was written gets the module's mode: ``training=self.training``
        on a functional call (keyword or positional), ``dropout_p=(p if self.training else
        0.0)`` for SDPA, ``nn.functional.dropout(x, p, training=self.training)`` for an
        ``nn.Dropout(p)(x)`` built in forward, ``nn.ModuleList``/``nn.ModuleDict`` around the
        plain list or dict that holds the layers. Unsafe where the script passed its own flag
        (``training=self.use_dropout``): that flag may be meant."""
        s = src.statement_at(finding.location.line)
        fn = src.enclosing_function(s) if s is not None else None
        if fn is None:
            return None
        params = fn.node.params.params
        if not params or params[0].name.value != "self":
            return None
        how = finding.evidence.get("how", "default")
        if how == "sdpa":
            return self._sdpa(src, s)
        if how == "unregistered":
            return self._built_in_forward(src, s) or self._plain_holder(src, s)
        fn_name = str(finding.evidence.get("function") or "dropout").split(".")[-1]
        calls = [c for c in src.nodes(src.cst.Call, within=s)
                 if src.code(c.func).split(".")[-1] == fn_name]
        if len(calls) != 1:
            return None
        call = calls[0]
        title = "follow the module's mode: training=self.training"
        safety = Safety.UNSAFE if how == "explicit" else None
        kw = [a for a in call.args if a.keyword is not None and a.keyword.value in ("training", "train")]
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if kw:
            return self.edit(title, src.replace(kw[0].value, "self.training"), safety=safety)
        if len(positional) >= 3:  # dropout(input, p, training[, inplace])
            return self.edit(title, src.replace(positional[2].value, "self.training"),
                             safety=safety)
        last = call.args[-1] if call.args else None
        if last is None or last.star:
            return None
        return self.edit(title, _append_argument(src, last, "training=self.training"),
                         safety=safety)

    def _sdpa(self, src, s):
        calls = [c for c in src.nodes(src.cst.Call, within=s)
                 if src.code(c.func).split(".")[-1] == "scaled_dot_product_attention"]
        if len(calls) != 1:
            return None
        args = calls[0].args
        kw = [a for a in args if a.keyword is not None and a.keyword.value == "dropout_p"]
        positional = [a for a in args if a.keyword is None and not a.star]
        arg = kw[0] if kw else positional[4] if len(positional) > 4 else None
        if arg is None:
            return None
        return self.edit("pass the dropout rate only in training",
                         src.replace(arg.value, f"({src.code(arg.value)} if self.training else 0.0)"))

    def _built_in_forward(self, src, s):
        """``nn.Dropout(p)(x)`` -> ``nn.functional.dropout(x, p, training=self.training)``."""
        cst = src.cst
        nn = torch_nn(src)
        for call in src.nodes(cst.Call, within=s):
            inner = call.func
            if not isinstance(inner, cst.Call):
                continue
            function = _FUNCTIONAL.get(src.code(inner.func).split(".")[-1])
            if function is None or len(call.args) != 1 or call.args[0].keyword is not None:
                continue
            rate = [a for a in inner.args if a.keyword is None or a.keyword.value == "p"]
            if len(rate) > 1 or any(a.keyword is not None and a.keyword.value not in ("p", "inplace")
                                    for a in inner.args) or nn is None:
                return None
            arguments = [src.code(call.args[0].value)]
            if rate:
                arguments.append(src.code(rate[0].value))
            arguments.append("training=self.training")
            return self.edit("a functional dropout that follows the module's mode",
                             src.replace(call, f"{nn}.functional.{function}({', '.join(arguments)})"))
        return None

    def _plain_holder(self, src, s):
        """The class's ``self.x = [nn.Dropout(...) ...]`` becomes an ``nn.ModuleList`` (a dict,
        an ``nn.ModuleDict``), so that eval() reaches the layers."""
        cst = src.cst
        owner = next((a for a in s.ancestors() if a.syntax == "ClassDef"), None)
        nn = torch_nn(src)
        if owner is None or nn is None:
            return None
        holders = (cst.List, cst.ListComp, cst.Tuple, cst.Dict, cst.DictComp)
        for assign in src.nodes(cst.Assign, within=owner):
            value = assign.value
            if not (len(assign.targets) == 1 and isinstance(value, holders)
                    and isinstance(assign.targets[0].target, cst.Attribute)
                    and src.code(assign.targets[0].target.value) == "self"):
                continue
            layers = [c for c in _calls(cst, value) if src.code(c.func).split(".")[-1] in _FUNCTIONAL]
            if not layers:
                continue
            wrapper = "ModuleDict" if isinstance(value, (cst.Dict, cst.DictComp)) else "ModuleList"
            body = src.code(value)
            if isinstance(value, cst.Tuple) and not body.startswith("("):
                body = f"({body})"
            return self.edit(f"register the layers: {wrapper}",
                             src.replace(value, f"{nn}.{wrapper}({body})"))
        return None

    def check(self, a):
        in_eval = {(e.loc.path, e.loc.line) for e in a.of_kind("dropout_default")
                   if e.loc is not None and e.get("mode", "eval") == "eval"}
        for e in a.of_kind("dropout_default"):
            fn, p, cls, name = e.get("fn", "dropout"), e.get("p"), e.get("cls", "Module"), e.get("name")
            how = e.get("how", "default")
            if e.get("mode", "eval") == "train":
                if e.loc is None or (e.loc.path, e.loc.line) in in_eval:
                    continue
                if self._guarded_by_mode(a, e.loc.path, e.loc.line):
                    continue  # `if self.training:` around it, or a rate that reads the mode
                switched = self._eval_call(a, e.loc.path)
                if switched is None:
                    continue  # never evaluated: dropout in training is what it is for
                module = f"{name} ({cls})" if name else cls
                rate = f"{p:.0%} of " if isinstance(p, (int, float)) else ""
                yield self.finding(
                    f"F.{fn} here leaves training at its default (True): it drops {rate}the "
                    f"activations of {module} in training as meant, but `{switched[1]}` (line "
                    f"{switched[0]}) will not switch it off, so the evaluation keeps dropping them "
                    f"and its metrics are noisy and lower than the model's",
                    e.loc, step=a.steps_before(e.seq) or None,
                    evidence={"function": fn, "p": p, "module": name or cls, "class": cls,
                              "grad": bool(e.get("grad")), "how": how, "mode": "train",
                              "eval_line": switched[0]})
                continue
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

    @staticmethod
    def _eval_call(a, path):
        """``(line, text)`` of the first ``x.eval()`` call in the module's file or in a file a
        backward ran from that no ``.train()`` call follows within 3 lines (a model frozen by
        ``eval()`` whose part is set back to train mode is the script's own mode keeping), else
        None."""
        paths = [path] + sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None} - {path})
        for where in paths:
            calls = a.source.calls_named(where, {"eval", "train"})
            trains = [line for line, text, _ in calls if text.endswith(".train()")]
            for line, text, _ in calls:
                if text.endswith(".eval()") and not any(line < t <= line + 3 for t in trains):
                    return line, text
        return None

    @staticmethod
    def _guarded_by_mode(a, path, line) -> bool:
        """Whether the call's line reads the mode (``p if self.training else 0.0``) or an ``if``
        that reads it encloses the call (found by indentation, up to the enclosing ``def``)."""
        text = a.source.line_text(path, line)
        if "training" in text.split("#")[0]:
            return True
        depth = len(text) - len(text.lstrip())
        for number in range(line - 1, max(0, line - 60), -1):
            above = a.source.line_text(path, number)
            code = above.split("#")[0]
            if not code.strip():
                continue
            indent = len(above) - len(above.lstrip())
            if indent >= depth:
                continue
            depth = indent
            head = code.strip()
            if head.startswith(("def ", "async def ", "class ")):
                return False
            if head.startswith(("if ", "elif ")) and "training" in head:
                return True
        return False
