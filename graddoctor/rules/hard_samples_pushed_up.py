from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from ..analysis.source import _enclosing_function
from .base import Rule, related


class HardSamplesPushedUp(Rule):
    """
    ## What it does
    Finds a per-sample loss (a torch loss called with `reduction="none"`) that the training
    loss uses twice or more — as a term and inside a weight made from it — in a way that makes
    the training loss *fall* when the hardest samples' loss rises: in the first backwards, the
    gradient the per-sample loss receives is negative on every sample whose loss is above some
    value and on none below it (or on all of them). It points at the line where the loss meets
    its weight (`(pt ** gamma * ce).mean()`), else at the loss call.

    ## Why is this bad?
    Gradient descent moves each sample's loss against the sign of that gradient: a negative
    sign raises it. A focal loss written `pt ** gamma * ce` (instead of `(1 - pt) ** gamma`),
    or weights computed from the loss and left attached (`w = torch.exp(-ce)`,
    `torch.softmax(-ce / T, 0)`, `(1 - ce / lam).clamp(min=0)` in self-paced learning), make
    the training loss decrease in the base loss above some value: the optimizer pushes the
    samples the model gets most wrong further wrong, and lowers the loss by giving up on them.
    The loss curve still goes down; accuracy on the hard classes does not.

    ## Example
    ```python
    ce = F.cross_entropy(logits, target, reduction="none")
    pt = torch.exp(-ce)
    loss = (pt ** gamma * ce).mean()
    ```

    ## Use instead
    ```python
    ce = F.cross_entropy(logits, target, reduction="none")
    pt = torch.exp(-ce)
    loss = ((1 - pt) ** gamma * ce).mean()
    ```
    (and weights meant as constants detached: `w = torch.exp(-ce).detach()`)

    ## Stays silent on
    A correct focal loss, poly loss, generalized or symmetric cross-entropy (increasing in the
    base loss); hard-example mining (`topk` of the losses); a mean plus a variance or standard
    deviation of the losses (the gradient is negative only on the easiest samples: pulled up
    toward the mean); per-sample flooding; REINFORCE or any weighting by detached advantages or
    importance weights (the sign does not follow the loss); a subtracted loss term used once
    (`loss-maximised` judges it); weights computed from the loss and detached.
    """

    code = "GD280"
    slug = "hard-samples-pushed-up"
    severity = Severity.WARNING
    summary = ("a per-sample loss reused in its own weight makes the training loss fall as the "
               "hardest samples' loss rises: training pushes them further wrong")
    fix = ("make the training loss increase with each sample's loss: `(1 - pt) ** gamma * ce` "
           "for a focal loss, or detach weights computed from the loss")

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("samples_pushed_up", ()):
            call = event.loc
            if call is None or (call.path, call.line) in told:
                continue
            told.add((call.path, call.line))
            combined = combining_line(a.source.tree(call.path), call.line)
            loc = Location(call.path, combined) if combined else call
            fn = event["fn"]
            every = event["pushed"] >= event["samples"]
            which = ("every sample" if every else
                     f"the {event['pushed']} of {event['samples']} samples whose {fn} is above "
                     f"{event['above']:.3g}")
            text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
            shown = f"`{text}`" if text else "this line"
            yield self.finding(
                f"{shown} uses the per-sample {fn} (line {call.line}) both as the term and in its "
                f"own weight, and the training loss falls as that loss rises: at the first "
                f"backwards its gradient is negative on {which}, so each update raises {fn} where it is "
                f"already highest — the samples the model gets most wrong are pushed further wrong",
                loc,
                related=(related(event, f"the per-sample {fn}"),) if loc is not call else (),
                evidence={"fn": fn, "samples": event["samples"], "pushed": event["pushed"],
                          "above": event["above"], "consumers": event["consumers"]},
                fix=_fix(text))


def _fix(text: str) -> str:
    if "**" in text and "1 -" not in text and "1-" not in text:
        return ("weight the hard samples up, not down: `(1 - pt) ** gamma * ce` (focal loss), or "
                "detach a weight meant as a constant")
    return ("detach the weight computed from the loss (`w.detach() * loss`), or use a weight that "
            "grows with the loss")


def combining_line(tree, line: int) -> int | None:
    """The line after ``line`` (a statement assigning one name from the per-sample loss call)
    where that name meets a value made from it (``(pt ** g * ce).mean()`` after ``pt =
    exp(-ce)``), or uses it twice; None when the call's result is not assigned to a plain name
    or no such line follows in the same function."""
    if tree is None:
        return None
    body = _enclosing_function(tree, line).body
    statements = [s for s in ast.walk(ast.Module(body=body, type_ignores=[]))
                  if isinstance(s, ast.stmt) and not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    statements.sort(key=lambda s: s.lineno)
    start = next((s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)
                  and isinstance(s, ast.Assign)), None)
    if start is None or len(start.targets) != 1 or not isinstance(start.targets[0], ast.Name):
        return None
    loss = start.targets[0].id
    derived: set[str] = set()
    for s in statements:
        if s.lineno <= (start.end_lineno or start.lineno):
            continue
        names = [n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        uses = names.count(loss)
        if uses == 0 and not derived.intersection(names):
            continue
        if uses >= 2 or (uses and derived.intersection(names)):
            return s.lineno
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            derived.add(s.targets[0].id)
    return None
