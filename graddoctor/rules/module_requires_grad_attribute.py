from __future__ import annotations

from ..analysis import listing, written
from ..findings import Safety, Severity
from .base import Rule, related
from .source import attribute_assignment


class ModuleRequiresGradAttribute(Rule):
    """
    ## What it does
    Finds `module.requires_grad = False` (or `= True`): an attribute set on an `nn.Module`
    object, where `module.requires_grad_(False)` was meant. It reports when the assignment
    changed nothing the script relied on: the module's parameters still get gradients and an
    optimizer still updates them (after `= False`), or they stay frozen (after `= True`). A
    module that keeps its own `requires_grad` option and reads it is left alone (nothing
    changes behind the user's back there).

    ## Why is this bad?
    `nn.Module` has no `requires_grad` flag: the assignment creates a plain attribute that
    nothing in torch reads. Every parameter keeps its own `requires_grad`, so the "frozen"
    backbone keeps training (its pretrained weights drift, the compute and memory of its
    gradients are spent), and a filter like `filter(lambda p: p.requires_grad, ...)` keeps
    every parameter. Nothing fails: the run merely trains what was meant to stay fixed.

    ## Example
    ```python
    model.backbone.requires_grad = False  # sets an attribute; freezes nothing
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ```

    ## Use instead
    ```python
    model.backbone.requires_grad_(False)  # sets requires_grad on every parameter
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ```

    ## Stays silent on
    `requires_grad_(False)` and `p.requires_grad = False` on the parameters; a module's own
    `requires_grad` option that it reads (its parameters get no gradient, or train as
    meant).
    """

    code = "GD114"
    slug = "module-requires-grad-attribute"
    severity = Severity.WARNING
    summary = "module.requires_grad = ... sets an attribute on the module: no parameter is (un)frozen"
    fix = "call module.requires_grad_(False), which sets requires_grad on each of its parameters"
    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``X.requires_grad = v`` -> ``X.requires_grad_(v)``, the line's comment kept. Safe
        for a freeze (the parameters stop training, as the line meant); unsafe for an unfreeze:
        an optimizer built without the frozen parameters still leaves them out."""
        found = attribute_assignment(src, finding.location.line, "requires_grad")
        if found is None:
            return None
        statement, target, value = found
        text = f"{src.code(target.value)}.requires_grad_({src.code(value)})"
        unfreeze = finding.evidence.get("value") is True
        return self.edit(f"call requires_grad_() on {src.code(target.value)}",
                         src.replace(statement, text),
                         safety=Safety.UNSAFE if unfreeze else None)

    def check(self, a):
        events = [e for e in a.of_kind("module_attr") if e.get("name") == "requires_grad"]
        if not events:
            return
        # one finding per line and value: a loop over model.children() sets it on each module
        groups: dict = {}
        for e in events:
            key = (e.loc, e.get("value") is True or e.get("value") == 1)
            groups.setdefault(key, []).append(e)
        for items in groups.values():
            e = items[0]
            pids = list(dict.fromkeys(pid for item in items for pid in item.get("params") or ()
                                      if pid in a.params))
            if not pids:
                continue
            value = e.get("value")
            variable = _target(a, e)
            if value is False or value == 0:
                trained = _stepped_after(a, pids, e.seq)
                if not trained:
                    continue  # nothing trains it anyway (no gradient reaches it, or no optimizer)
                opts = sorted({opt for pid in trained for opt in a.owners.get(pid, ())})
                stepped_by = " and ".join(a.optimizer_name(o) for o in opts)
                yield self.finding(
                    f"{variable}.requires_grad = False sets an attribute on the {_classes(items)} "
                    f"and freezes none of {'its' if len(items) == 1 else 'their'} parameters: "
                    f"{a.names(trained)} still "
                    f"get gradients and {stepped_by} keeps updating them",
                    e.loc,
                    related=(related(a.last_writer(trained[0], a.events[-1].seq + 1),
                                     "a backward that gives them gradients"),),
                    fix=f"{variable}.requires_grad_(False) (sets requires_grad on each of its "
                        "parameters)",
                    evidence={"params": [a.param_name(p) for p in trained], "value": False},
                )
            elif value is True or value == 1:
                frozen = [pid for pid in pids if a.params[pid].get("requires_grad") is False]
                if len(frozen) != len(pids):
                    continue  # some of them train: the attribute may be the module's own option
                yield self.finding(
                    f"{variable}.requires_grad = True sets an attribute on the {_classes(items)} "
                    f"and unfreezes none of {'its' if len(items) == 1 else 'their'} parameters: "
                    f"{a.names(frozen)} stay "
                    "frozen and never train",
                    e.loc,
                    fix=f"{variable}.requires_grad_(True) (and give the parameters to the "
                        "optimizer if it was built without them)",
                    evidence={"params": [a.param_name(p) for p in frozen], "value": True},
                )


def _classes(items) -> str:
    """'Sequential object', or 'Linear and ReLU objects' for a loop over several modules."""
    names = list(dict.fromkeys(item.get("cls") or "Module" for item in items))
    if len(items) == 1:
        return f"{names[0]} object"
    return f"{listing(names, 3)} objects ({len(items)} modules)"


def _target(a, event) -> str:
    """The assigned object as the user wrote it (``model.backbone``), else ``module``."""
    loc = event.loc
    found = a.source.assigned_object(loc.path, loc.line, "requires_grad") if loc is not None else None
    return found or "module"


def _stepped_after(a, pids, seq: int) -> list[int]:
    """Those of ``pids`` that a backward after ``seq`` wrote and an optimizer owning them then
    stepped."""
    wanted = set(pids)
    pending: set[int] = set()
    trained: dict[int, None] = {}
    for e in a.after(seq):
        if e.kind == "backward":
            pending.update(pid for pid in written(e) if pid in wanted)
        elif e.kind == "step" and not e.get("skipped"):
            mine = set(a.opt_params.get(e.get("opt"), ())) & pending
            trained.update(dict.fromkeys(sorted(mine)))
    return [pid for pid in pids if pid in trained]
