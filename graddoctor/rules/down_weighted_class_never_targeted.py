from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_FILLS = ("full", "full_like", "new_full", "zeros", "zeros_like", "new_zeros", "ones", "ones_like",
          "new_ones")
_LOSSES = ("cross_entropy", "nll_loss")


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def target_fill(tree: ast.AST, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the fill that builds the target of the loss called on ``line``: the
    target argument's last assignment above it in the same function, when that is a
    ``torch.full(...)``, ``zeros``, ``ones`` (or their ``_like`` and ``new_`` forms)."""
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and n.lineno <= line
             <= (n.end_lineno or n.lineno) and len(n.args) >= 2]
    named = [c for c in calls if _call_name(c.func) in _LOSSES] or calls
    if len(named) != 1:
        return None
    call = named[0]
    target = next((k.value for k in call.keywords if k.arg == "target"), call.args[1])
    if not isinstance(target, ast.Name):
        return None
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    assigns = [n for n in walk(scope) if isinstance(n, ast.Assign) and n.lineno < line
               and any(isinstance(t, ast.Name) and t.id == target.id for t in n.targets)]
    if not assigns:
        return None
    last = max(assigns, key=lambda n: n.lineno)
    if isinstance(last.value, ast.Call) and _call_name(last.value.func) in _FILLS:
        return last.lineno, ast.unparse(last).strip()
    return None


class DownWeightedClassNeverTargeted(Rule):
    """
    ## What it does
    Finds class weights that single out one class below all the others (a DETR-style
    `empty_weight[-1] = eos_coef`, a segmentation's down-weighted background) while none of the
    targets of the first calls of `cross_entropy`/`nll_loss` is that class (256 targets or
    more): the entries meant as "no object" or "background" are filled with another class.
    Reported at the `torch.full`/`zeros` that builds the loss's target when the source shows
    one (the fill value is what to change), else at the loss call.

    ## Why is this bad?
    Set prediction and dense detection fill the targets of unmatched queries or background
    pixels with a dedicated class and down-weight it. Filled with a real class instead
    (`torch.full(shape, 0)` where `num_classes` was meant, an off-by-one between a background
    at 0 and at the end), every unmatched query is trained to predict that real class at full
    weight, the no-object logit is never a target, and the weight meant for it does nothing.
    The loss falls; the model predicts a real object for every query.

    ## Example
    ```python
    empty_weight = torch.ones(num_classes + 1)
    empty_weight[-1] = eos_coef
    target_classes = torch.full(logits.shape[:2], 0, dtype=torch.int64)
    target_classes[idx] = matched_labels
    loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, empty_weight)
    ```

    ## Use instead
    ```python
    target_classes = torch.full(logits.shape[:2], num_classes, dtype=torch.int64)
    ```

    ## Stays silent on
    A background at class 0 filled with 0 and weighted at 0 (the weight is on the class the
    fill uses); class weights of several values (inverse frequencies: a rare class may be
    missing from the first batches); a class weighted up, not down; fewer than 256 targets
    counted.
    """

    code = "GD386"
    slug = "down-weighted-class-never-targeted"
    severity = Severity.WARNING
    summary = ("the one class the weights put below the others (no-object, background) is never a "
               "target: the empty entries are filled with another class")
    fix = "fill the unmatched or background entries of the target with the class the weight singles out"

    def check(self, a):
        for e in a.of_kind("weighted_class_absent"):
            loc, related, fill = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                fill = target_fill(tree, e.loc.line) if tree is not None else None
                if fill is not None:
                    loc = Location(e.loc.path, fill[0])
                    related = (Related(e.loc, "the loss whose weight singles the class out"),)
            cls, top = e["cls"], e["top"]
            where = f"`{fill[1]}` fills the target" if fill else "the targets are filled"
            yield self.finding(
                f"the class weights of {e['fn']} put class {cls} at {e['weight']:g} and every other "
                f"class at {e['others']:g} — a no-object or background class — yet none of the "
                f"{e['targets']} targets of its first calls is class {cls}, while class {top} "
                f"makes up {e['top_share']:.0%} of them: {where} with class {top}, so the empty "
                f"entries train a real class at full weight and the down-weighted class is never "
                f"learned",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=(f"fill the empty entries with class {cls}, the one the weight singles out "
                     f"(e.g. torch.full(..., {cls}) or num_classes)"),
                evidence={k: e[k] for k in ("fn", "cls", "weight", "others", "targets", "top",
                                            "top_share")})
