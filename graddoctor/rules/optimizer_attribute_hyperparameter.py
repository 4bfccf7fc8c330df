from __future__ import annotations

import re

from ..findings import Autofix, Edit, Safety, Severity
from .base import Rule, related


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else "?"


class OptimizerAttributeHyperparameter(Rule):
    """
    ## What it does
    Finds a hyper-parameter of a torch.optim optimizer set as an attribute of the optimizer
    object (`optimizer.lr = 1e-4`, `optimizer.momentum = 0.5`, `optimizer.weight_decay = 0`,
    `optimizer.betas = (0.5, 0.999)`, `optimizer.learning_rate = ...`), or the learning rate
    set as an attribute of a torch LR scheduler (`scheduler.lr = 1e-4`), or written into the
    optimizer's `defaults` after it was built (`optimizer.defaults["lr"] = 1e-4`,
    `optimizer.defaults["lr"] *= 0.1`, `optimizer.defaults.update(weight_decay=0)`), when the
    optimizer steps after it with another value in its param groups.

    ## Why is this bad?
    PyTorch's optimizers keep their hyper-parameters per parameter group and read
    `optimizer.param_groups[i]["lr"]` at every step, never an attribute of the optimizer;
    torch's schedulers write the lr into those groups and read no `lr` attribute either.
    `defaults` is copied into a param group only when the group is added (at construction or
    by `add_param_group`), never read by the step.
    The assignment creates a new attribute nobody reads: it raises no error, and training goes
    on with the old value (a learning rate meant to drop 100x at epoch 2 stays where it was).
    An optimizer or scheduler class of your own that reads `self.lr` is not judged.

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
    The learning rate changed through every param group (and a scheduler's `base_lrs`);
    bookkeeping attributes that are no hyper-parameter; an optimizer class of the script's own
    whose `step` reads the attribute, a scheduler class of its own whose `get_lr` or `step`
    does; a value the param groups already hold; `defaults` set right before
    `add_param_group` (the new group takes its values from there), kept in sync after the
    groups were changed, or read by an optimizer class of the script's own. Not seen: a
    change made on a copy of a param group (`g = dict(optimizer.param_groups[0])`).
    """

    code = "GD113"
    slug = "optimizer-attribute-hyperparameter"
    severity = Severity.WARNING
    summary = ("a hyper-parameter is set as an optimizer (or scheduler) attribute "
               "(optimizer.lr = ...), which torch's step never reads")
    fix = ('set it in every param group: `for group in optimizer.param_groups: '
           'group["lr"] = 1e-4`')

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``opt.lr = v`` -> ``for group in opt.param_groups: group["lr"] = v``, on two lines,
        the line's comment kept; ``scheduler.lr = v`` the same on ``scheduler.optimizer``, for
        a scheduler that scales the groups' current lr (for the others the fix is no edit)."""
        cst = src.cst
        attr, key = finding.evidence.get("attribute"), finding.evidence.get("key")
        if finding.evidence.get("defaults"):
            return self._defaults_autofix(finding, src, key)
        scheduler = finding.evidence.get("scheduler")
        if scheduler is not None and scheduler not in CHAINED:
            return Autofix(title="", safety=self.fix_safety, refused=(
                f"no automatic edit: {scheduler} computes each lr from its base_lrs or the "
                "arguments it was built with; which of them the new lr belongs in is a "
                "person's call"))
        s = src.statement_at(finding.location.line)
        if s is None or len(s.node.body) != 1 or not isinstance(s.node.body[0], cst.Assign):
            return None
        assign = s.node.body[0]
        if len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Attribute) or target.attr.value != attr:
            return None
        owner = src.code(target.value) + (".optimizer" if scheduler is not None else "")
        indent = src.indent(s)
        line, col, end_line, end_col = src.span(assign)
        text = (f"for group in {owner}.param_groups:\n{indent}    group[\"{key}\"] = "
                f"{src.code(assign.value)}")
        return self.edit(f'set "{key}" in every param group of {owner}',
                         Edit(src.path, line, col, end_line, end_col, text))

    def _defaults_autofix(self, finding, src, key):
        """``opt.defaults["lr"] *= 0.1`` -> ``for group in opt.param_groups: group["lr"] *=
        0.1`` (``opt.defaults.update(...)`` -> ``group.update(...)``): the same statement, on
        each param group instead of the defaults."""
        s = src.statement_at(finding.location.line)
        if s is None or len(s.node.body) != 1:
            return None
        statement = s.node.body[0]
        code = src.code(statement)
        found = re.search(r"([A-Za-z_][\w.]*)\.defaults\b", code)
        if found is None or "\n" in code:
            return None
        owner = found.group(1)
        indent = src.indent(s)
        line, col, end_line, end_col = src.span(statement)
        text = (f"for group in {owner}.param_groups:\n{indent}    "
                f"{code.replace(owner + '.defaults', 'group')}")
        return self.edit(f'set "{key}" in every param group of {owner}',
                         Edit(src.path, line, col, end_line, end_col, text))

    def check(self, a):
        told: set[tuple] = set()  # (line, optimizer) of defaults writes told: one finding a line
        for event in a.of_kind("optimizer_attr"):
            opt, cls, name, key = event["opt"], event["cls"], event["name"], event["key"]
            scheduler = event.get("scheduler")
            later = [s for s in a.steps
                     if s["opt"] == opt and s.seq > event.seq and not s.get("skipped")]
            if not later:
                continue  # never stepped again: the value would not have been used
            kept = list(dict.fromkeys(event["kept"] or [None]))
            if any(k is None for k in kept):
                stepping = f"the {key} in its param_groups"
            else:
                stepping = f"param_groups {key} {' / '.join(_number(k) for k in kept)}"
            value = "" if event["value"] is None else f" = {_number(event['value'])}"
            steps = a.count(later)
            # the script's own name for the optimizer, as the assignment wrote it
            owner = (a.source.assigned_object(event.loc.path, event.loc.line, name)
                     if event.loc is not None else None)
            shown = _number(event["value"]) if event["value"] is not None else "..."
            updates = f"in the {steps} update{'s' if steps != 1 else ''} after it"
            evidence = {"optimizer": cls, "attribute": name, "key": key,
                        "value": event["value"], "param_groups": event["kept"],
                        "steps_after": steps}
            if name.startswith("defaults["):
                if any(e.seq > event.seq and e["opt"] == opt for e in a.of_kind("optimizer_init")):
                    continue  # a param group added after it takes its value from the defaults
                line = (event.loc.path, event.loc.line) if event.loc is not None else None
                if (line, opt) in told:
                    continue
                told.add((line, opt))
                also = [e["key"] for e in a.of_kind("optimizer_attr")
                        if e is not event and e["opt"] == opt and e.loc is not None
                        and (e.loc.path, e.loc.line) == line and e["name"].startswith("defaults[")]
                owner = _defaults_owner(a, event) or "optimizer"
                evidence["defaults"] = True
                evidence["also"] = also
                message = (f"`{owner}.{name}{value}` writes the {cls} optimizer's defaults, which "
                           f"its step never reads: torch copies `defaults` into a param group "
                           f"only when the group is added and steps with "
                           f"`param_groups[i][\"{key}\"]`, so {cls} keeps stepping with "
                           f"{stepping} {updates}"
                           + (f" (and its {', '.join(also)} keeps its group value too)" if also else ""))
                fix = (f'set it in every param group instead: `for group in '
                       f'{owner}.param_groups: group["{key}"] = {shown}`')
            elif scheduler is None:
                owner = owner or "optimizer"
                message = (f"`.{name}{value}` sets an attribute on the {cls} optimizer that its "
                           f"step never reads: torch's {cls} reads `param_groups[i][\"{key}\"]`, "
                           f"so {cls} keeps stepping with {stepping} {updates}")
                fix = (f'set it in every param group instead: `for group in '
                       f'{owner}.param_groups: group["{key}"] = {shown}`')
            else:
                owner = owner or "scheduler"
                evidence["scheduler"] = scheduler
                message = (f"`.{name}{value}` sets an attribute on the {scheduler} scheduler that "
                           f"neither it nor the optimizer reads: both take the lr from "
                           f"`param_groups[i][\"lr\"]`, so {cls} keeps stepping with the lr "
                           f"{scheduler} gives its param groups ({stepping} when it was set) "
                           f"{updates}")
                fix = _scheduler_fix(scheduler, owner, shown)
            yield self.finding(message, event.loc,
                               related=(related(later[0], f"the next {cls} step"),),
                               evidence=evidence, fix=fix)


def _defaults_owner(a, event) -> str | None:
    """The script's name for the optimizer whose defaults the line writes (`opt.defaults[...]`)."""
    if event.loc is None:
        return None
    text = a.source.line_text(event.loc.path, event.loc.line)
    found = re.search(r"([A-Za-z_][\w.]*)\.defaults\b", text or "")
    return found.group(1) if found else None


# torch's schedulers that scale the groups' current lr at each step: an lr set in the groups
# stays, and the schedule goes on from it
CHAINED = frozenset({"StepLR", "MultiStepLR", "ExponentialLR", "MultiplicativeLR",
                     "ReduceLROnPlateau"})


def _scheduler_fix(scheduler: str, owner: str, shown: str) -> str:
    if scheduler in CHAINED:
        return (f"set it in the optimizer's param groups, which {scheduler} scales from: "
                f'`for group in {owner}.optimizer.param_groups: group["lr"] = {shown}`')
    if scheduler in ("LambdaLR", "CosineAnnealingLR", "PolynomialLR", "LinearLR", "ConstantLR",
                     "CosineAnnealingWarmRestarts"):
        return (f"{scheduler} computes each step's lr from its base_lrs: set "
                f"`{owner}.base_lrs = [{shown}] * len({owner}.base_lrs)` (and the param groups' "
                "\"lr\" for the steps before its next step)")
    return (f"{scheduler} computes each step's lr from the arguments it was built with: build "
            f"a new {scheduler} with the lr you want")
