from __future__ import annotations

import math

from ..findings import Role, Severity
from .base import Rule, related, times

MIN_SCALE = 2.0 ** 10  # loss scales are powers of two; smaller ones may be a batch size (a summed loss)
# optimizers whose update is proportional to the gradient: a constant factor on the loss
# multiplies the update (Adam, RMSprop, Adagrad... divide it out, but for epsilon)
PROPORTIONAL = frozenset({"SGD", "ASGD"})


def _loss_scale(factor) -> bool:
    return (isinstance(factor, float) and factor >= MIN_SCALE
            and math.log2(factor) == int(math.log2(factor)))


class LossScaleNotUndone(Rule):
    """
    ## What it does
    Finds hand-written loss scaling that is never undone: every backward of an update ran on
    the loss multiplied by a large power of two (`(loss * 2**k).backward()`, 1024 or more),
    and nothing changed the gradients between those backwards and the step (no
    `p.grad.div_(2**k)`, no clip, no `GradScaler`), with SGD, whose update is proportional to
    the gradient. Optimizers that normalise the gradient (Adam, RMSprop, Adagrad) are left
    alone: for them a constant factor changes only the role of epsilon. A smaller factor, or
    one that is not a power of two, reads as a loss weight or a batch size (a summed loss) and
    is left alone too.

    ## Why is this bad?
    Static loss scaling keeps small fp16 gradients from underflowing; the gradients must be
    divided by the same factor before the step. Without that, SGD applies an update 2**k times
    too large: the loss jumps or turns NaN, or the learning rate silently means something else.

    ## Example
    ```python
    (loss * 1024).backward()
    optimizer.step()                  # SGD steps gradients 1024 times too large
    ```

    ## Use instead
    ```python
    (loss * 1024).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(1024)
    optimizer.step()                  # or let torch.amp.GradScaler do both halves
    ```

    ## Stays silent on
    Adam over a loss times a constant (Adam divides a constant factor out of its update);
    weighted loss terms; hand-written unscaling (`p.grad.div_`, seen as in-place edits).
    """

    code = "GD216"
    slug = "loss-scale-not-undone"
    severity = Severity.WARNING
    summary = ("the loss is multiplied by a loss scale (2**k) before backward and the gradients "
               "are never divided back before an SGD step")
    fix = ("divide every gradient by the same factor before the step (`p.grad.div_(scale)`), or "
           "let torch.amp.GradScaler scale and unscale")

    def check(self, a):
        touched = [e for e in a.of_kind("grad_edit", "clip", "unscale") if not e.get("norm_only")]
        groups: dict = {}
        for opt, windows in a.windows.items():
            if a.optimizer_class(opt) not in PROPORTIONAL:
                continue
            owned = set(a.opt_params.get(opt, ()))
            for w in windows:
                if w.step.get("skipped") or w.step.get("closure") or not w.group:
                    continue
                factors = {b.get("loss_scale_factor") for b in w.group}
                if len(factors) != 1 or not _loss_scale(next(iter(factors))):
                    continue
                if any(b.get("scaled") for b in w.group):
                    continue  # a GradScaler's backward: its own rules judge it
                first = w.group[0].seq
                if any(first < e.seq < w.step.seq and (e.get("opt") == opt
                                                       or owned.intersection(e.get("params") or ()))
                       for e in touched):
                    continue  # the gradients were changed (divided, clipped) before the step
                groups.setdefault(w.group[-1].loc, []).append((w, next(iter(factors))))
        for loc, items in groups.items():
            w, factor = items[0]
            occurrences = a.count(i[0].step for i in items)
            yield self.finding(
                f"this backward runs on the loss multiplied by {factor:g} and nothing divides the "
                f"gradients back before {a.optimizer_name(w.step['opt'])} steps: the update is "
                f"{factor:g} times too large (seen {times(occurrences)})",
                loc, step=a.step_number.get(w.step.seq),
                related=(related(w.step, "the step that applies the scaled gradients", Role.STEP),),
                evidence={"factor": factor, "optimizer": w.step["opt"],
                          "occurrences": occurrences},
            )
