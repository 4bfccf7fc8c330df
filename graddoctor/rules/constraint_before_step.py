from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

# calls of the loop that are no constraint write: the update's own and the gradients'
_LOOP_CALLS = frozenset({"backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_",
                         "unscale_", "update", "print", "append", "item", "log"})


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _calls_between(tree: ast.AST, first: int, last: int) -> list[tuple[int, str]]:
    """Statements strictly between lines ``first`` and ``last`` that only call a function of
    the script's (``apply_masks()``, ``project(model)``): ``[(line, name)]``."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and first < node.lineno < last:
            name = _called(node.value)
            if name and name not in _LOOP_CALLS and not name.endswith("_"):
                found.append((node.lineno, name))
    return sorted(found)


def _writes_between(tree: ast.AST, first: int, last: int) -> list[tuple[int, str]]:
    """In-place writes strictly between lines ``first`` and ``last`` that ``param_writes`` does
    not list: any in-place method (``w.masked_fill_(m, 0)``, ``w.index_fill_(...)``) and item
    assignments (``w[pad] = 0``), never on a ``.grad``: ``[(line, root name)]``."""
    found = []
    for node in walk(tree):
        if not first < getattr(node, "lineno", 0) < last:
            continue
        target = None
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute):
            name = node.value.func.attr
            if name.endswith("_") and not name.startswith("_") and name not in _LOOP_CALLS:
                target = node.value.func.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Subscript):
            target = node.targets[0].value
        if target is None:
            continue
        chain = []
        while isinstance(target, (ast.Attribute, ast.Subscript, ast.Call)):
            if isinstance(target, ast.Attribute):
                chain.append(target.attr)
                target = target.value
            else:
                target = target.value if isinstance(target, ast.Subscript) else target.func
        if isinstance(target, ast.Name) and "grad" not in chain:
            found.append((node.lineno, target.id))
    return sorted(found)


class ConstraintBeforeStep(Rule):
    """
    ## What it does
    Finds a constraint written into the weights at the wrong point of the update: between
    `loss.backward()` and `optimizer.step()`. Over each optimizer's first steps, the weights the
    script changed in place after the backward are compared with what they were: a write that
    clamps them (WGAN's weight clipping, a non-negativity projection), zeroes them (a pruning
    mask, a padding row kept at zero) or scales rows to a norm bound (max-norm, unit-norm
    embeddings) is a constraint. When the optimizer's step then breaks it (weights outside the
    clamp, nonzero where the write zeroed them, rows above the bound) and the next forward still
    runs on the broken weights, at two steps or more, the write is reported.

    ## Why is this bad?
    The step comes after the constraint and undoes it: the gradient, momentum, Adam's update
    and weight decay move the pruned weights off zero, push clipped weights past the clip and
    rows past their norm. Every forward then runs on weights outside the constraint: the
    pruned network is dense again, the WGAN critic is not Lipschitz-bounded, the factorisation
    has negative entries, the embeddings leave the sphere. Nothing fails; the constraint just
    never holds when the model is used.

    ## Example
    ```python
    loss.backward()
    for p in critic.parameters():
        p.data.clamp_(-0.01, 0.01)
    opt.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    opt.step()
    for p in critic.parameters():
        p.data.clamp_(-0.01, 0.01)
    ```

    ## Stays silent on
    The constraint written after the step (or at the start of the iteration, before the
    forward); written both before and after the step; a mask applied to the weights and to
    their gradients before a step that keeps the zeros (SGD without momentum, Adam whose
    moments stay zero there); `torch.nn.utils.prune` and masks multiplied in the forward;
    writes that set no constraint (SAM's restore of the perturbed weights, a decay or update by
    hand); a clamp the step does not push past; a write seen once (a one-off pruning or reset);
    parameters on an accelerator (not read).
    """

    code = "GD194"
    slug = "constraint-before-step"
    severity = Severity.WARNING
    summary = ("a clamp, mask or norm bound is written into the weights between backward() and "
               "step(): the step undoes it, and every forward runs on weights outside it")
    fix = "apply the constraint after optimizer.step() (or after it as well), not between backward() and step()"

    def check(self, a):
        for event in a.by_kind.get("constraint_broken", ()):
            pids = list(event.get("params") or ())
            if not pids or event.loc is None:
                continue
            step = event.loc
            write = self._write_line(a, event, pids)
            kinds = event["kinds"]
            verbs = {"clamp": "clamps", "zero": "zeroes entries of", "norm": "rescales the rows of"}
            what = f"{verbs[kinds[0]]} {a.names(pids)}" if len(kinds) == 1 else \
                f"writes constraints into {a.names(pids)}"
            after = {"clamp": "outside the clamp", "zero": "nonzero where the write zeroed them",
                     "norm": "with row norms off the bound"}
            broke = " / ".join(after[k] for k in kinds)
            opt = a.source.called_object(step.path, step.line, "step") or "optimizer"
            where = write or step
            rel = (related(event, "the optimizer step that undoes it"),) if write is not None else ()
            units = "rows" if kinds == ["norm"] else "sampled entries"
            note = ("; to keep the masked weights at zero through the step too, also mask their "
                    "gradients before it"
                    if "zero" in kinds else "")
            yield self.finding(
                f"{'this line' if write is not None else 'code between the backward and this step'} "
                f"{what} after loss.backward() but before {opt}.step(): the step moves the weights "
                f"again right after it, and after {event['times']} such steps the next forward ran "
                f"on weights {broke} ({event['broken']} {units}). The constraint holds only "
                f"between the write and the step, never when the model is used",
                where, related=rel, step=a.next_step_number(event.seq),
                evidence={"params": a.param_names(pids[:16]), "kinds": kinds,
                          "bounds": event.get("bounds"), "written": event["written"],
                          "broken": event["broken"], "times": event["times"]},
                fix=(f"move the write after {opt}.step(), so that it constrains the weights the "
                     f"step produced{note}"))

    @staticmethod
    def _write_line(a, event, pids) -> Location | None:
        """The script's line that wrote the constraint: an in-place write of a parameter between
        the backward and the step in the step's file (the one naming a parameter's module, else
        the first), else a call of the script's own function there (a helper that writes)."""
        step, backward = event.loc, event.get("backward")
        if not backward or backward[0] != step.path or not backward[1] < step.line:
            return None
        first, last = int(backward[1]), step.line
        tree = a.source.tree(step.path)
        writes = [w for w in a.source.param_writes(step.path) if first < w[0] < last]
        if tree is not None:
            listed = {w[0] for w in writes}
            writes += [(line, root, "", None) for line, root in _writes_between(tree, first, last)
                       if line not in listed]
            writes.sort()
        if writes:
            roots = {name.split(".")[0] for name in a.param_names(pids)}
            named = [w for w in writes if w[1] in roots or (w[3] and any(r in w[3] for r in roots))]
            return Location(step.path, (named or writes)[0][0])
        calls = _calls_between(tree, first, last) if tree is not None else []
        if calls:
            return Location(step.path, calls[0][0])
        return None
