from __future__ import annotations

from ..analysis import listing, written
from ..findings import Safety, Severity
from .base import Rule, related
from .source import attribute_assignment


class ModuleRequiresGradAttribute(Rule):
    """
    ## What it does
    Finds a freeze written as an attribute torch never reads: `module.requires_grad = False`
    on an `nn.Module` object, where `module.requires_grad_(False)` was meant, and the other
    names of that wish on a module or on a parameter: `requires_grad_ = False` (assigned over
    the method instead of calling it), a misspelt flag (`require_grad`, `requires_gard`,
    `requires_grads`, ...), Keras' `trainable = False`. It reports when the assignment changed
    nothing the script relied on: the parameters still get gradients and an optimizer still
    updates them (after `= False`), or they stay frozen (after `= True`). An attribute the
    script reads back itself, so that the parameters really stop training, is left alone.

    ## Why is this bad?
    `nn.Module` has no `requires_grad` flag, and a tensor's only flag is `requires_grad`: each
    of these assignments creates a plain attribute that nothing in torch reads (and
    `p.requires_grad_ = False` also hides the method). Every parameter keeps its own
    `requires_grad`, so the "frozen" backbone keeps training (its pretrained weights drift,
    the compute and memory of its gradients are spent), and a filter like
    `filter(lambda p: p.requires_grad, ...)` keeps every parameter. Nothing fails: the run
    merely trains what was meant to stay fixed.

    ## Example
    ```python
    model.backbone.requires_grad = False  # sets an attribute; freezes nothing
    for p in model.encoder.parameters():
        p.requires_grad_ = False  # hides the method; p.requires_grad stays True
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ```

    ## Use instead
    ```python
    model.backbone.requires_grad_(False)  # sets requires_grad on every parameter
    for p in model.encoder.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ```

    ## Stays silent on
    `requires_grad_(False)` and `p.requires_grad = False` on the parameters; a module's own
    `requires_grad` option, or a `trainable` marker, that the script reads (its parameters get
    no gradient, or train as meant); attributes frameworks set on parameters on purpose
    (Megatron's `tensor_model_parallel`, `expert`, `_no_weight_decay`, DeepSpeed's `ds_*`):
    only the names of a freeze are looked at.
    """

    code = "GD114"
    slug = "module-requires-grad-attribute"
    severity = Severity.WARNING
    summary = ("module.requires_grad = ... (or p.requires_grad_ = ..., a misspelt flag, trainable) "
               "sets an attribute torch never reads: no parameter is (un)frozen")
    fix = "call module.requires_grad_(False), which sets requires_grad on each of its parameters"
    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``X.requires_grad = v`` (or ``X.requires_grad_ = v``, ``X.trainable = v``, a
        misspelling) -> ``X.requires_grad_(v)``, the line's comment kept. Safe for a freeze
        (the parameters stop training, as the line meant); unsafe for an unfreeze: an optimizer
        built without the frozen parameters still leaves them out."""
        found = attribute_assignment(src, finding.location.line,
                                     finding.evidence.get("attribute") or "requires_grad")
        if found is None:
            return None
        statement, target, value = found
        text = f"{src.code(target.value)}.requires_grad_({src.code(value)})"
        unfreeze = finding.evidence.get("value") is True
        return self.edit(f"call requires_grad_() on {src.code(target.value)}",
                         src.replace(statement, text),
                         safety=Safety.UNSAFE if unfreeze else None)

    def check(self, a):
        events = [e for e in a.of_kind("module_attr") if e.get("name") not in MODE_METHODS]
        events += a.of_kind("param_attr")
        if not events:
            return
        # one finding per line, name and value: a loop over model.children() or over the
        # parameters sets it on each module or tensor
        groups: dict = {}
        for e in sorted(events, key=lambda e: e.seq):
            value = e.get("value")
            if value not in (True, False, 0, 1) or isinstance(value, float):
                continue  # not a flag's value
            key = (e.loc, e.get("name"), e.kind, value is True or value == 1)
            groups.setdefault(key, []).append(e)
        for (_, name, kind, on), items in groups.items():
            e = items[0]
            on_tensors = kind == "param_attr"
            pids = list(dict.fromkeys(pid for item in items for pid in _pids(item)
                                      if pid in a.params))
            if not pids:
                continue
            variable = _target(a, e)
            what = _what(items, on_tensors)
            why = _why(name, on_tensors)
            its = "its" if len(items) == 1 and not on_tensors else "their"
            shown = e.get("value")
            if not on:
                trained = _stepped_after(a, pids, e.seq)
                if not trained:
                    continue  # nothing trains it anyway (no gradient reaches it, or no optimizer)
                opts = sorted({opt for pid in trained for opt in a.owners.get(pid, ())})
                stepped_by = " and ".join(a.optimizer_name(o) for o in opts)
                freezes = ("freezes none of them" if on_tensors
                           else f"freezes none of {its} parameters")
                yield self.finding(
                    f"{variable}.{name} = {shown} sets an attribute on the {what}{why} and "
                    f"{freezes}: {a.names(trained)} still get gradients and {stepped_by} keeps "
                    "updating them",
                    e.loc,
                    related=(related(a.last_writer(trained[0], a.events[-1].seq + 1),
                                     "a backward that gives them gradients"),),
                    fix=f"{variable}.requires_grad_(False) (sets requires_grad on "
                        + ("the tensor itself)" if on_tensors else "each of its parameters)"),
                    evidence={"params": [a.param_name(p) for p in trained], "value": False,
                              "attribute": name},
                )
            else:
                if on_tensors:
                    frozen = [pid for pid in pids
                              if any(i.get("requires_grad") is False for i in items
                                     if i["pid"] == pid)]
                    frozen = [pid for pid in frozen if pid not in _written_after(a, [pid], e.seq)]
                else:
                    frozen = [pid for pid in pids if a.params[pid].get("requires_grad") is False]
                if not frozen or len(frozen) != len(pids):
                    continue  # some of them train: the attribute may be the script's own option
                unfreezes = ("unfreezes none of them" if on_tensors
                             else f"unfreezes none of {its} parameters")
                yield self.finding(
                    f"{variable}.{name} = {shown} sets an attribute on the {what}{why} and "
                    f"{unfreezes}: {a.names(frozen)} stay frozen and never train",
                    e.loc,
                    fix=f"{variable}.requires_grad_(True) (and give the parameters to the "
                        "optimizer if it was built without them)",
                    evidence={"params": [a.param_name(p) for p in frozen], "value": True,
                              "attribute": name},
                )


# names that shadow Module.train / Module.eval: another rule's (module-method-shadowed)
MODE_METHODS = ("train", "eval")


def _pids(event) -> list[int]:
    return [event["pid"]] if event.kind == "param_attr" else list(event.get("params") or ())


def _why(name: str, on_tensors: bool) -> str:
    """What the name is to torch, for a name other than a module's ``requires_grad``."""
    if name == "requires_grad":
        return ""
    if name == "requires_grad_":
        return " that hides the requires_grad_() method (torch reads only `requires_grad`)"
    if name == "trainable":
        return " (Keras' name: torch reads only `requires_grad`)"
    return f" (`{name}` is no name torch knows: it reads only `requires_grad`)"


def _what(items, on_tensors: bool) -> str:
    """'Sequential object', 'Linear and ReLU objects (2 modules)', 'Parameter', '4 Parameters'."""
    if on_tensors:
        names = list(dict.fromkeys(item.get("cls") or "Tensor" for item in items))
        kind = " and ".join(names)
        return kind if len(items) == 1 else f"{len(items)} {kind}s"
    return _classes(items)


def _classes(items) -> str:
    """'Sequential object', or 'Linear and ReLU objects' for a loop over several modules."""
    names = list(dict.fromkeys(item.get("cls") or "Module" for item in items))
    if len(items) == 1:
        return f"{names[0]} object"
    return f"{listing(names, 3)} objects ({len(items)} modules)"


def _target(a, event) -> str:
    """The assigned object as the user wrote it (``model.backbone``, ``p``), else ``module`` or
    ``param``."""
    loc = event.loc
    found = (a.source.assigned_object(loc.path, loc.line, event.get("name") or "requires_grad")
             if loc is not None else None)
    return found or ("param" if event.kind == "param_attr" else "module")


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


def _written_after(a, pids, seq: int) -> set[int]:
    """Those of ``pids`` a backward after ``seq`` gave a gradient."""
    wanted = set(pids)
    return {pid for e in a.after(seq) if e.kind == "backward" for pid in written(e) if pid in wanted}
