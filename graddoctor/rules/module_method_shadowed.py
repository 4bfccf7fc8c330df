from __future__ import annotations

from ..findings import Safety, Severity
from .base import Rule, related
from .source import attribute_assignment

# what a BatchNorm or dropout layer does in the mode it was left in
_IN_TRAIN = {"dropout": "dropout on", "batchnorm": "BatchNorm normalising with each batch's "
             "statistics and writing them into its running ones"}
_IN_EVAL = {"dropout": "dropout off", "batchnorm": "BatchNorm normalising with running "
            "statistics that stop adapting"}


class ModuleMethodShadowed(Rule):
    """
    ## What it does
    Finds `model.eval = True`, `model.train = False` (or `= True`, `model.eval = False`): a
    value assigned over an `nn.Module`'s `eval()` or `train()` method where the call was
    meant. It reports when it mattered: a forward after it ran the module's dropout or
    BatchNorm layers in the mode the line meant to leave.

    ## Why is this bad?
    `train` and `eval` are methods; assigning to them stores a plain attribute on that one
    module object and switches no mode. The model stays in train mode for the validation that
    follows (dropout on, BatchNorm normalising with the validation batch and folding it into
    its running statistics), or in eval mode for the training that follows. Later calls of
    `model.eval()` or `model.train()` on it (or on a model holding it) then fail with
    "'bool' object is not callable", so a script that runs to its end never switched it.

    ## Example
    ```python
    model.eval = True
    with torch.no_grad():
        val_loss = loss_fn(model(x_val), y_val)
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        val_loss = loss_fn(model(x_val), y_val)
    model.train()
    ```

    ## Stays silent on
    `model.eval()` and `model.train()` called; a method replaced with a function on purpose
    (a callable assigned); a module of the script's own that keeps a `train` option while it
    runs in the mode that option says; a module with no dropout or BatchNorm layer, or that no
    forward runs after the assignment.
    """

    code = "GD179"
    slug = "module-method-shadowed"
    severity = Severity.WARNING
    summary = "model.eval = True (or model.train = False) assigns over the method: no mode is switched"
    fix = "call the method: model.eval() before evaluating, model.train() before training again"
    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``X.eval = True`` -> ``X.eval()``, ``X.train = False`` -> ``X.eval()`` (and the
        other two), the line's comment kept."""
        name, meant = finding.evidence.get("attribute"), finding.evidence.get("meant")
        if name not in ("train", "eval") or meant not in ("train", "eval"):
            return None
        if finding.evidence.get("other_lines"):
            return None  # the other assignments must become calls too: one edit is no fix
        found = attribute_assignment(src, finding.location.line, name)
        if found is None:
            return None
        statement, target, _ = found
        owner = src.code(target.value)
        return self.edit(f"call {owner}.{meant}()", src.replace(statement, f"{owner}.{meant}()"))

    def check(self, a):
        kinds = {e.get("mid"): e.get("layer") for e in a.of_kind("mode_module")}
        assigned = [e for e in a.of_kind("module_attr") if e.get("name") in ("train", "eval")]
        for e in assigned:
            name, value = e.get("name"), e.get("value")
            if type(value) not in (bool, int):
                continue
            layers = set(e.get("layers") or ())
            if not layers:
                continue
            meant = name if value else ("eval" if name == "train" else "train")
            left_training = meant == "eval"  # the mode the module was left in
            wrong = next((f for f in a.after(e.seq) if f.kind == "mode_forward"
                          and bool(f.get("training")) == left_training
                          and layers & set(f.get("modules") or ())), None)
            if wrong is None:
                continue
            ran = layers & set(wrong.get("modules") or ())
            effects = _IN_TRAIN if left_training else _IN_EVAL
            found = sorted({kinds.get(mid) for mid in ran} & set(effects))
            effect = "; ".join(effects[k] for k in found) or (
                "its dropout and BatchNorm layers in " + ("train" if left_training else "eval")
                + " mode")
            variable = (a.source.assigned_object(e.loc.path, e.loc.line, name)
                        if e.loc is not None else None) or "model"
            mode = "train" if left_training else "eval"
            at = f" at line {wrong.loc.line}" if wrong.loc is not None else ""
            # the same module's other assignments over its methods: once this line calls the
            # method, a method still shadowed elsewhere makes that call fail
            others = sorted({o.loc.line for o in assigned if o.get("mid") == e.get("mid")
                             and o.loc is not None and o.loc != e.loc
                             and (e.loc is None or o.loc.path == e.loc.path)})
            also = (f"; the same module's {_lines(others)} must become "
                    + ("a call too, or the call fails on the attribute it leaves"
                       if len(others) == 1 else
                       "calls too, or the call fails on the attributes they leave")
                    if others else "")
            yield self.finding(
                f"{variable}.{name} = {value} assigns a value over the {e.get('cls')}'s {name}() "
                f"method instead of calling it: no mode changes, and the forward{at} after it "
                f"runs the model in {mode} mode ({effect})",
                e.loc,
                related=(related(wrong, f"a forward in {mode} mode"),),
                fix=f"call {variable}.{meant}()" + (
                    f" (and {variable}.train() before training again)" if meant == "eval" else "")
                    + also,
                evidence={"attribute": name, "value": value, "meant": meant,
                          "module": e.get("cls"), "other_lines": others},
            )


def _lines(lines: list[int]) -> str:
    return (f"assignment at line {lines[0]}" if len(lines) == 1
            else "assignments at lines " + ", ".join(str(n) for n in lines))
