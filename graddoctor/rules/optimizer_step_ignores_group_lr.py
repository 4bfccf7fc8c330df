from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk


def _lr_reads(step: ast.FunctionDef) -> tuple[list[tuple[int, str]], bool]:
    """``([(line, shown)], group_read)``: the reads of a single lr the step takes from the
    optimizer object (``self.defaults["lr"]``, ``self.defaults.get("lr")``, ``self.lr``), and
    whether it reads ``"lr"`` from anything else (``group["lr"]``: a param group)."""
    single, group_read = [], False
    for node in walk(step):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value == "lr":
            if _is_self_attr(node.value, "defaults"):
                single.append((node.lineno, 'self.defaults["lr"]'))
            else:
                group_read = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == "lr":
            if _is_self_attr(node.func.value, "defaults"):
                single.append((node.lineno, 'self.defaults.get("lr")'))
            else:
                group_read = True
        elif isinstance(node, ast.Attribute) and node.attr == "lr" and isinstance(node.ctx, ast.Load) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            single.append((node.lineno, "self.lr"))
    return single, group_read


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr \
        and isinstance(node.value, ast.Name) and node.value.id == "self"


def _step_of(tree: ast.AST, cls: str) -> ast.FunctionDef | None:
    """The ``step`` method of the script's class ``cls``, when the class is defined in the file
    and subclasses an optimizer (a base whose name ends with ``Optimizer``)."""
    for node in walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
        if not any(str(b).endswith("Optimizer") for b in bases):
            return None
        return next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "step"), None)
    return None


def _shown(lrs: list) -> str:
    values = sorted(set(lrs))
    if len(values) == 1:
        return f"lr {values[0]:.3g}"
    return f"lrs {values[0]:.3g} to {values[-1]:.3g}"


class OptimizerStepIgnoresGroupLr(Rule):
    """
    ## What it does
    Finds an optimizer class of the script's own (a `torch.optim.Optimizer` subclass) whose
    `step()` takes its learning rate from the optimizer object, `self.defaults["lr"]` (or
    `.get("lr")`) or `self.lr`, and reads no `"lr"` from a param group, while the run gave its
    param groups two lrs or more: groups built with their own lrs (layer-wise lr decay, no
    decay for the head), or an lr a scheduler or the script changed between steps. It points at
    the read in `step()`.

    ## Why is this bad?
    torch's schedulers, `add_param_group` and every per-group setting write
    `optimizer.param_groups[i]["lr"]`; `defaults` is only the template a group is filled from
    when it is added. A step that reads `self.defaults["lr"]` applies the constructor's lr to
    every group at every step: the warm-up and the decay never happen and layer-wise decay is
    flat. Nothing fails; the lr the scheduler reports is not the one applied.

    ## Example
    ```python
    class LARS(torch.optim.Optimizer):
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    ...
                    p.add_(buf, alpha=-self.defaults["lr"])
    ```

    ## Use instead
    ```python
                    p.add_(buf, alpha=-group["lr"])
    ```

    ## Stays silent on
    A step that reads `group["lr"]` (also when it reads `self.defaults` for something else); a
    single lr over the whole run (one group, no schedule: the two are the same value); torch's
    own optimizers; a class that is not an optimizer (a scheduler whose `step` reads `self.lr`).
    """

    code = "GD421"
    slug = "optimizer-step-ignores-group-lr"
    severity = Severity.WARNING
    summary = ("an optimizer class of the script's own reads its lr from self.defaults / self.lr "
               "in step(), so the param groups' lrs (schedulers, per-group lrs) are never applied")
    fix = 'read the lr of the param group being updated in step(): `group["lr"]`'

    def check(self, a):
        timeline = a.lr_timeline
        seen = set()
        for opt, init in a.optimizers.items():
            cls = init.get("cls")
            if not cls or init.loc is None or cls in seen:
                continue
            # the first and the last step's lrs of each group: what folding a long run keeps
            groups = [points for points in timeline.get(opt, {}).values() if points]
            first = [g[0].lr for g in groups if g[0].lr is not None]
            last = [g[-1].lr for g in groups if g[-1].lr is not None]
            lrs = {round(v, 12) for v in first + last}
            if len(lrs) < 2:
                continue
            tree = a.source.tree(init.loc.path)
            step = _step_of(tree, cls) if tree is not None else None
            if step is None:
                continue
            single, group_read = _lr_reads(step)
            if not single or group_read:
                continue
            seen.add(cls)
            line, shown = single[0]
            yield self.finding(
                f"{cls}.step() takes its lr from `{shown}` and reads no param group's lr, while "
                f"its param groups held {_shown(first)} at the first step and {_shown(last)} at "
                f"the last: every group is updated with the one lr the optimizer was built "
                f"with, so the scheduler's changes and the per-group lrs are never applied",
                Location(init.loc.path, line),
                related=(related(init, f"the {cls} built here"),),
                fix=f'replace `{shown}` with the lr of the param group being updated (`group["lr"]`)',
                evidence={"optimizer": cls, "read": shown, "lrs": sorted(lrs)[:8]},
            )
