from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_REDUCTIONS = frozenset({"mean", "sum", "amax", "max", "amin", "min", "logsumexp", "std", "var",
                         "median", "nanmean"})


def _statement_at(tree, line: int):
    """The innermost statement of ``tree`` that spans ``line``."""
    best = None
    for node in walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def _keepdim_reduction(node) -> bool:
    """Whether ``node`` holds a reduction over an axis other than 0 that keeps it
    (``x.mean(dim=1, keepdim=True)``): one value per row, broadcast back over the classes."""
    for call in walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in _REDUCTIONS):
            continue
        keywords = {k.arg: k.value for k in call.keywords}
        keep = keywords.get("keepdim", call.args[1] if len(call.args) > 1 else None)
        if not (isinstance(keep, ast.Constant) and keep.value is True):
            continue
        dim = keywords.get("dim", call.args[0] if call.args else None)
        if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub):
            return True
        if isinstance(dim, ast.Constant) and isinstance(dim.value, int) and dim.value != 0:
            return True
    return False


def reduction_line(a, loc) -> int | None:
    """The line that reduced the per-row term over the classes, when the statement at ``loc``
    combines a variable assigned from such a reduction (``batch_center =
    teacher_out.mean(dim=1, keepdim=True)``, then ``center = center * m + batch_center * (1 -
    m)``): the line to change. None when the statement reduces itself or none is found."""
    tree = a.source.tree(loc.path)
    statement = _statement_at(tree, loc.line) if tree is not None else None
    if statement is None or _keepdim_reduction(statement):
        return None
    lines = set()
    for name in {n.id for n in walk(statement) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Load)}:
        found = a.source.term_assignment(loc.path, loc.line, name)
        if found is None or found[0] >= loc.line:
            continue
        assigned = _statement_at(tree, found[0])
        if assigned is not None and _keepdim_reduction(assigned):
            lines.add(found[0])
    return lines.pop() if len(lines) == 1 else None


class LogitShiftCancels(Rule):
    """
    ## What it does
    Finds a term added alike to every class of a row before a softmax, a log_softmax or a
    cross_entropy over those classes: a margin subtracted from every class's cosine instead of
    the target's (AM-softmax, CosFace: `s * (cos - m)`), a per-sample output added to all the
    logits (`cls(h) + difficulty(h)`), a scalar bias parameter on attention scores, a DINO
    center averaged over the classes (`teacher_out.mean(dim=1, keepdim=True)`: one number per
    sample). Seen in the forward of the first backwards: an addition from the script whose one
    operand is the same along the class axis (a number, a size-1 axis, or values repeated along
    it) while the other varies, carried through products by factors also the same along it,
    reaching a softmax over that axis. Reported at the line that adds the term.

    ## Why is this bad?
    A softmax does not see what every class gets alike: `softmax(x + c) == softmax(x)` for any
    `c` constant along the classes, and `cross_entropy` is a log_softmax. The term cancels
    exactly, in the loss and in every gradient: the margin meant to separate classes does not
    exist, the parameters of a per-sample term get exactly zero gradient through it, the
    center does nothing. Training runs and looks normal.

    ## Example
    ```python
    cos = F.linear(F.normalize(emb), F.normalize(self.W))
    logits = self.s * (cos - self.m)          # every class loses m: nothing changes
    loss = F.cross_entropy(logits, labels)
    ```

    ## Use instead
    ```python
    logits = self.s * (cos - self.m * F.one_hot(labels, cos.size(1)))   # the target's only
    ```

    ## Stays silent on
    A margin on the target class only (`one_hot`, `scatter`, `torch.where`); logit adjustment by
    class priors (different per class); a temperature (a factor, not a term); the row max,
    logsumexp or mean of the same logits subtracted (a stable softmax written out, a no-op on
    purpose); an epsilon (below 1e-3) or a term still zero (a center before its first update);
    a DINO center averaged over the batch (one value per class); a value shifted per row and
    read by a loss that is not shift-invariant (a dueling Q-network's value under MSE, logits
    shifted before a sigmoid); attention masks (they differ across keys). Values are read on
    the CPU only (`--emulate-cuda` runs a GPU script's path there).
    """

    code = "GD190"
    slug = "logit-shift-cancels"
    severity = Severity.WARNING
    summary = ("a term added alike to every class before a softmax or cross_entropy cancels: "
               "the margin, bias or center it was meant to be changes nothing")
    fix = ("make the term differ across the classes (a margin on the target class only: "
           "`cos - m * F.one_hot(labels, num_classes)`), or remove it")

    def check(self, a):
        told: set = set()
        for event in a.by_kind.get("shift_cancelled", ()):
            loc = event.loc
            if loc is None or (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
            shown = f"`{text}`" if text else "this line"
            consumer = event["consumer"]
            classes = event["classes"]
            if event["grad"]:
                what = (f"{shown} adds a term that depends on parameters but is the same for all "
                        f"{classes} classes of each row; the {consumer} it reaches is invariant "
                        f"to such a shift, so the term cancels and those parameters get exactly "
                        f"zero gradient through it")
                fix = ("give the term one value per class (or drop it: it can only be a no-op "
                       "before a softmax); a per-sample quantity belongs in another loss")
            elif event.get("scalar"):
                value = event["value"]
                size = f" ({value:.3g})" if isinstance(value, (int, float)) else ""
                what = (f"{shown} shifts all {classes} classes of every row by the same "
                        f"number{size} before a {consumer}, which is invariant to such a shift: "
                        f"the term cancels and changes neither the loss nor any gradient (a "
                        f"margin subtracted from every class instead of the target's does "
                        f"nothing)")
                fix = self.fix
            else:
                reduced_at = reduction_line(a, loc)
                if reduced_at is not None:
                    loc = Location(loc.path, reduced_at)
                    text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
                    shown = f"`{text}`" if text else "this line"
                value = event["value"]
                size = f" (up to {value:.3g})" if isinstance(value, (int, float)) else ""
                what = (f"{shown} makes a term with one value per row{size}, the same for all "
                        f"{classes} classes, that a {consumer} later reads: the {consumer} is "
                        f"invariant to such a shift, so the term cancels and does nothing — a "
                        f"statistic reduced over the class axis, where one value per class "
                        f"(reduced over the batch) was meant, behaves like this")
                fix = ("reduce over the batch so that the term holds one value per class "
                       "(`.mean(dim=0, keepdim=True)` of a (batch, classes) tensor), or remove "
                       "it if a per-row term was meant: the softmax cannot see it")
            yield self.finding(what, loc, evidence={"consumer": consumer, "classes": classes,
                                                    "grad": event["grad"],
                                                    "scalar": event.get("scalar"),
                                                    "value": event["value"]},
                               fix=fix)
