from __future__ import annotations

import ast

from ..analysis.source import scope_walk as _own_nodes
from ..findings import Severity
from ..trace import Location
from ..analysis.source import _enclosing_function
from .base import Rule, related
from ..analysis.source import walk

_UNREDUCED = ("binary_cross_entropy_with_logits", "binary_cross_entropy", "cross_entropy",
              "nll_loss")


def _unreduced_call(value: ast.AST) -> bool:
    """``F.binary_cross_entropy_with_logits(..., reduction="none")`` and the like."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in _UNREDUCED:
        return False
    return any(k.arg == "reduction" and isinstance(k.value, ast.Constant)
               and k.value.value == "none" for k in value.keywords)


def weighting_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of the multiplications, in the function that computes it, of an
    unreduced classification loss's result (a name assigned from the call) by another factor."""
    out = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]
    for scope in scopes:
        inside = list(_own_nodes(scope))
        names = set()
        for statement in inside:
            if isinstance(statement, ast.Assign) and _unreduced_call(statement.value):
                names |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
        if not names:
            continue
        for statement in inside:
            if not isinstance(statement, (ast.Assign, ast.AugAssign, ast.Return)):
                continue
            for node in walk(statement):
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and any(
                        isinstance(side, ast.Name) and side.id in names
                        for side in (node.left, node.right)):
                    out.append((statement.lineno, ast.unparse(statement).strip()))
                    break
    return sorted(set(out))


class HardSamplesPushedUp(Rule):
    """
    ## What it does
    Finds a per-sample loss (a torch loss called with `reduction="none"`) that the training
    loss uses twice or more — as a term and inside a weight made from it — in a way that makes
    the training loss *fall* when the hardest samples' loss rises: in the first backwards, the
    gradient the per-sample loss receives is negative on every sample whose loss is above some
    value and on none below it (or on all of them). It points at the line where the loss meets
    its weight (`(pt ** gamma * ce).mean()`), else at the loss call.

    The same inverted factor computed from the predictions rather than from the loss
    (`p = torch.sigmoid(logits)`, `p_t = p * t + (1 - p) * (1 - t)`, `ce * p_t ** gamma`, the
    way dense detectors write a sigmoid focal loss) leaves the per-sample loss a positive
    gradient, so it is seen another way: in the graph of the first 3 backwards, an unreduced
    `binary_cross_entropy_with_logits`, `binary_cross_entropy`, `cross_entropy` or `nll_loss`
    multiplied by a weight with a graph of its own whose rank correlation with the loss, within
    each group of elements sharing one target value, is below -0.9 on average. It points at the
    multiplication of the loss's result in the script.

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
    or, with the probabilities taken from the logits:
    ```python
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = (ce * p_t ** gamma).sum() / num_pos
    ```

    ## Use instead
    ```python
    ce = F.cross_entropy(logits, target, reduction="none")
    pt = torch.exp(-ce)
    loss = ((1 - pt) ** gamma * ce).mean()
    # with the probabilities taken from the logits
    loss = (ce * (1 - p_t) ** gamma).sum() / num_pos
    ```
    (and weights meant as constants detached: `w = torch.exp(-ce).detach()`)

    ## Stays silent on
    A correct focal loss, poly loss, generalized or symmetric cross-entropy (increasing in the
    base loss); hard-example mining (`topk` of the losses); a mean plus a variance or standard
    deviation of the losses (the gradient is negative only on the easiest samples: pulled up
    toward the mean); per-sample flooding; REINFORCE or any weighting by detached advantages or
    importance weights (the sign does not follow the loss); a subtracted loss term used once
    (`loss-maximised` judges it); weights computed from the loss and detached. For a weight
    made from the predictions: mmdetection's `pt.pow(gamma)` with `pt = 1 - p_t`,
    `torch.where(t > 0.5, 1 - p, p) ** gamma`, CenterNet's `pred ** 2` on the negatives (all
    grow with the loss); a per-class `alpha` or a 0/1 mask (constant within a target's group, or
    few values); a weight without a graph (detached on purpose); soft targets (a quality focal
    loss's IoU targets: no group of one target value).
    """

    code = "GD280"
    slug = "hard-samples-pushed-up"
    severity = Severity.WARNING
    summary = ("a per-sample loss reused in its own weight makes the training loss fall as the "
               "hardest samples' loss rises: training pushes them further wrong")
    fix = ("make the training loss increase with each sample's loss: `(1 - pt) ** gamma * ce` "
           "for a focal loss, or detach weights computed from the loss")

    def check(self, a):
        yield from self._pushed(a)
        yield from self._weighted_by_probability(a)

    def _pushed(self, a):
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

    def _weighted_by_probability(self, a):
        """A weight computed from the predictions rather than from the loss (``p_t`` from
        ``sigmoid(logits)``): the ``easy_weighted`` events of instrument/easyweight.py."""
        shown_at = {(e.loc.path, combining_line(a.source.tree(e.loc.path), e.loc.line) or e.loc.line)
                    for e in a.by_kind.get("samples_pushed_up", ()) if e.loc is not None}
        for e in a.of_kind("easy_weighted"):
            loc, text = e.loc, None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                lines = weighting_lines(tree) if tree is not None else []
                if len(lines) == 1:
                    loc = Location(e.loc.path, lines[0][0])
                    text = lines[0][1]
            if loc is not None and (loc.path, loc.line) in shown_at:
                continue  # the weight made from the loss itself, told above
            if text is None and shown_at:
                continue  # not placed in the source, and the loss-made weight is told already
            if loc is not None:
                shown_at.add((loc.path, loc.line))
            fn = e["fn"]
            written = f"`{text}`" if text else f"a weight ({'×'.join(str(s) for s in e['shape'])})"
            yield self.finding(
                f"{written} multiplies the unreduced {fn} by a factor computed from the "
                f"predictions that falls as the loss rises (rank correlation {e['rho']:+.2f} "
                f"with it, within the {e['elements']} elements of one target): the elements the "
                f"model already gets right weigh most and the hard ones least — an inverted focal "
                f"factor; past ce = 1/gamma the loss falls as an element's {fn} rises, so the "
                f"hardest elements (a detector's rare positives) are pushed further wrong",
                loc,
                related=(related(e, "the backward whose graph holds it"),) if loc is not e.loc else (),
                step=a.next_step_number(e.seq),
                evidence={"fn": fn, "shape": list(e["shape"]), "rho": e["rho"],
                          "groups": e["groups"], "elements": e["elements"]},
                fix=("weight by (1 - p_t) ** gamma, where p_t = p * t + (1 - p) * (1 - t) is the "
                     "probability of each element's own target"))


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
    statements = [s for s in walk(ast.Module(body=body, type_ignores=[]))
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
        names = [n.id for n in walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        uses = names.count(loss)
        if uses == 0 and not derived.intersection(names):
            continue
        if uses >= 2 or (uses and derived.intersection(names)):
            return s.lineno
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            derived.add(s.targets[0].id)
    return None
