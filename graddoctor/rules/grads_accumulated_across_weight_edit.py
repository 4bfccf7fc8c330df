from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule

_UPDATES = 2  # updates in which it must be seen


_KEEP_FLAG = "zero_grad=False"
_FLAG_SPAN = 12  # lines between the two backwards searched for the call that kept the gradients


def _kept_by_flag(a, before, at: Location | None) -> Location | None:
    """The line between the two backwards of one function that asks to keep the gradients
    (SAM's ``first_step(zero_grad=False)``): the call a person changes, when there is one."""
    if not before or at is None or before[0] != at.path or not 0 < at.line - before[1] <= _FLAG_SPAN:
        return None
    for line in range(before[1] + 1, at.line):
        text = a.source.line_text(at.path, line).split("#")[0].replace(" ", "")
        if _KEEP_FLAG in text:
            return Location(at.path, line)
    return None


class GradsAccumulatedAcrossWeightEdit(Rule):
    """
    ## What it does
    Finds a backward that adds its gradients onto those of an earlier backward of the same
    update although the script moved the stepped weights in place between the two (SAM's
    ascent to `w + e`): nothing cleared the first gradients, and no optimizer step ran in
    between. At the first backwards a strided sample of the optimizer's CPU parameters is
    compared with the one taken at the previous backward; most of them changed, and the
    backward then adds onto the gradients left there, in two updates.

    ## Why is this bad?
    The step applies the sum of the gradients taken at two different points, `g(w) + g(w + e)`,
    not the gradient at the perturbed point that SAM (ASAM, GSAM) is built on: the update is
    plain gradient descent with about twice the learning rate plus the perturbation's noise,
    and the sharpness term is lost. Nothing fails; the run trains like a slightly worse SGD.

    ## Example
    ```python
    loss_fn(model(x), y).backward()       # g(w): used to compute e
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rho * p.grad / grad_norm)
    loss_fn(model(x), y).backward()       # adds g(w + e) onto g(w)
    ```

    ## Use instead
    ```python
    loss_fn(model(x), y).backward()
    with torch.no_grad():
        ...                               # e from the first gradients, weights moved to w + e
    optimizer.zero_grad()                 # SAM's first_step(zero_grad=True)
    loss_fn(model(x), y).backward()       # g(w + e) alone
    ```

    ## Stays silent on
    SAM with the gradients cleared between the two passes; gradient accumulation over
    micro-batches at unchanged weights; a pruning mask re-applied to weights it already
    zeroed (their values do not change); an embedding's `max_norm` renormalising a few rows (most
    weights unchanged); the weights moved by an optimizer step between the two backwards (a
    GAN's two players, Lookahead's sync); hand-written updates with no optimizer
    (hand-update-without-zero-grad reports those). Not seen: GPU parameters (their values are
    not read). It points at the backward that adds onto the kept gradients, or at the call
    between the two backwards that asked to keep them (`first_step(zero_grad=False)`).
    """

    code = "GD284"
    slug = "grads-accumulated-across-weight-edit"
    severity = Severity.WARNING
    summary = ("a backward adds onto the gradients of an earlier one although the weights were "
               "edited in place in between (SAM without zero_grad): the step applies "
               "g(w) + g(w + e)")
    fix = "clear the gradients (optimizer.zero_grad()) after using the first ones and before the second backward"

    def check(self, a):
        owned = {pid for pids in a.opt_params.values() for pid in pids}
        backwards = a.of_kind("backward")
        hits: dict = {}  # backward line -> [(aside, pids)]
        for e in a.of_kind("weights_edited"):
            moved = [pid for pid in e.get("params") or () if pid in owned]
            if not moved or e.loc is None:
                continue
            following = next((b for b in backwards if b.seq > e.seq), None)
            if following is None or following.get("in_step") is not None:
                continue
            onto = set(following.get("accumulated") or ())
            summed = [pid for pid in moved if pid in onto]
            if not summed or 2 * len(summed) < len(moved):
                continue
            if a.next_step(following.seq) is None:
                continue
            hits.setdefault((e.loc.path, e.loc.line), []).append((e, summed))
        for _key, seen in hits.items():
            steps = {a.next_step_number(e.seq) for e, _ in seen}
            if len(steps) < _UPDATES:
                continue
            e, summed = seen[0]
            before = e.get("before")
            loc = _kept_by_flag(a, before, e.loc) or e.loc
            related = [] if loc is e.loc else [Related(e.loc, "the backward that adds onto them")]
            where = "an earlier backward"
            if before:
                where = f"the backward at line {before[1]}"
                related.append(Related(Location(before[0], before[1]), "the backward whose gradients are kept"))
            step = a.next_step(e.seq)
            if step is not None and step.loc is not None:
                related.append(Related(step.loc, "the step that applies their sum"))
            yield self.finding(
                f"this backward adds the gradients of {a.names(summed)} onto those {where} left, "
                f"although the script moved these weights in place in between (no zero_grad, no "
                f"optimizer step): the step applies the sum of gradients taken at two different "
                f"points, g(w) + g(w + e), not the gradient at the perturbed weights (SAM's "
                f"sharpness-aware update is lost; it trains like SGD at about twice the lr)",
                loc, step=a.next_step_number(e.seq), related=related,
                evidence={"params": summed[:16], "updates": len(steps)},
                fix=("clear the gradients before this backward, once the first ones are used "
                     "(optimizer.zero_grad(), or SAM's first_step(zero_grad=True)); if summing "
                     "over perturbed weights is meant, divide by the number of points"))
