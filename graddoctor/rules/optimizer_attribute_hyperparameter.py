from __future__ import annotations

from ..findings import Edit, Safety, Severity
from .base import Rule, related


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else "?"


class OptimizerAttributeHyperparameter(Rule):
    """
    ## What it does
    Finds a hyper-parameter of a torch.optim optimizer set as an attribute of the optimizer
    object (`optimizer.lr = 1e-4`, `optimizer.momentum = 0.5`, `optimizer.weight_decay = 0`,
    `optimizer.learning_rate = ...`) when the optimizer steps after it.

    ## Why is this bad?
    PyTorch's optimizers keep their hyper-parameters per parameter group and read
    `optimizer.param_groups[i]["lr"]` at every step, never an attribute of the optimizer.
    The assignment creates a new attribute nobody reads: it raises no error, and training goes
    on with the old value (a learning rate meant to drop 100x at epoch 2 stays where it was).
    An optimizer class of your own whose `step` reads `self.lr` is not judged.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        if epoch == 2:
            optimizer.lr = 1e-3
        train_one_epoch(model, optimizer)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        if epoch == 2:
            for group in optimizer.param_groups:
                group["lr"] = 1e-3
        train_one_epoch(model, optimizer)
    ```

    ## Stays silent on
    The learning rate changed through every param group; bookkeeping attributes that are no
    hyper-parameter; an optimizer class of the script's own whose `step` reads the
    attribute.
    """

    code = "GD113"
    slug = "optimizer-attribute-hyperparameter"
    severity = Severity.WARNING
    summary = ("a hyper-parameter is set as an optimizer attribute (optimizer.lr = ...), "
               "which torch's step never reads")
    fix = ('set it in every param group: `for group in optimizer.param_groups: '
           'group["lr"] = 1e-4`')

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``opt.lr = v`` -> ``for group in opt.param_groups: group["lr"] = v``, on two lines,
        the line's comment kept."""
        cst = src.cst
        attr, key = finding.evidence.get("attribute"), finding.evidence.get("key")
        s = src.statement_at(finding.location.line)
        if s is None or len(s.node.body) != 1 or not isinstance(s.node.body[0], cst.Assign):
            return None
        assign = s.node.body[0]
        if len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Attribute) or target.attr.value != attr:
            return None
        owner = src.code(target.value)
        indent = src.indent(s)
        line, col, end_line, end_col = src.span(assign)
        text = (f"for group in {owner}.param_groups:\n{indent}    group[\"{key}\"] = "
                f"{src.code(assign.value)}")
        return self.edit(f'set "{key}" in every param group of {owner}',
                         Edit(src.path, line, col, end_line, end_col, text))

    def check(self, a):
        for event in a.of_kind("optimizer_attr"):
            opt, cls, name, key = event["opt"], event["cls"], event["name"], event["key"]
            later = [s for s in a.steps
                     if s["opt"] == opt and s.seq > event.seq and not s.get("skipped")]
            if not later:
                continue  # never stepped again: the value would not have been used
            kept = list(dict.fromkeys(event["kept"]))
            if any(k is None for k in kept):
                stepping = f"the {key} in its param_groups"
            else:
                stepping = f"param_groups {key} {' / '.join(_number(k) for k in kept)}"
            value = "" if event["value"] is None else f" = {_number(event['value'])}"
            steps = a.count(later)
            # the script's own name for the optimizer, as the assignment wrote it
            owner = (a.source.assigned_object(event.loc.path, event.loc.line, name)
                     if event.loc is not None else None) or "optimizer"
            yield self.finding(
                f"`.{name}{value}` sets an attribute on the {cls} optimizer that its step never "
                f"reads: torch's {cls} reads `param_groups[i][\"{key}\"]`, so {cls} keeps "
                f"stepping with {stepping} in the {steps} update{'s' if steps != 1 else ''} "
                f"after it",
                event.loc,
                related=(related(later[0], f"the next {cls} step"),),
                evidence={"optimizer": cls, "attribute": name, "key": key,
                          "value": event["value"], "param_groups": event["kept"],
                          "steps_after": steps},
                fix=(f'set it in every param group instead: `for group in {owner}.param_groups: '
                     f'group["{key}"] = {_number(event["value"]) if event["value"] is not None else "..."}`'),
            )
