from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule, related


class HandUpdateDiscarded(Rule):
    """
    ## What it does
    Finds a hand-written update (no `torch.optim` optimizer) that computes the new value of a
    parameter and throws it away, so that no parameter ever changes: a loop variable assigned
    an expression of its own gradient (`for p in model.parameters(): p = p - lr * p.grad`),
    or an out-of-place op whose result nothing keeps (`p.sub(lr * p.grad)`), or the update
    written in place into the gradient instead of the parameter (`p.grad.add_(p.data,
    alpha=-lr)`: target and argument swapped). Reported only
    when the run confirms it: backward ran again and again, and no tensor it wrote changed
    between two of them. Also, with or without a torch optimizer, an EMA or target-network
    update written the same way: in a loop over `zip(ema.parameters(), model.parameters())`,
    the loop variable assigned a blend of itself and the other parameter
    (`ema_p = d * ema_p + (1 - d) * p`) and never read after it: the copy keeps its initial
    weights (reported once backward ran twice or more).

    ## Why is this bad?
    `p = p - lr * p.grad` makes the name `p` hold a new tensor; the parameter it named keeps
    its value. `p.sub(...)` returns a new tensor as well. The loop runs, the loss is computed
    and printed, gradients are computed every iteration, and the model never learns. The same
    assignment in an EMA update leaves the EMA (or target) model at its initial weights: the
    model trains, and the copy that is evaluated, checkpointed or used for targets never
    follows it.

    ## Example
    ```python
    for x, y in batches:
        model.zero_grad()
        loss_fn(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p = p - lr * p.grad
    ```

    ## Use instead
    ```python
    for x, y in batches:
        model.zero_grad()
        loss_fn(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    ```

    ## Stays silent on
    In-place updates (`p -= ...`, `p.sub_(...)`, `p.copy_(...)`, `p.data = ...`), an EMA
    written in place (`ema_p.mul_(d).add_(p, alpha=1 - d)`, `ema_p.data = ...`,
    `ema_p.copy_(...)`) or whose blended value is stored further down the loop; a loop
    variable rebound to its gradient alone (`p = p.grad.clone()`: reading gradients, not
    updating); gradients computed without any update (a Fisher or saliency estimate with no
    update statement); scripts with a torch optimizer (but for the EMA form); weight decay
    added into the gradient by hand (`p.grad.add_(p.data, alpha=wd)`) before an update that
    does change the parameters.
    """

    code = "GD121"
    slug = "hand-update-discarded"
    severity = Severity.ERROR
    summary = ("a hand-written update (or EMA update) computes new parameter values and throws them away: no "
               "parameter ever changes")
    fix = ("update the parameter in place under torch.no_grad(): p -= lr * p.grad (or "
           "p.sub_(lr * p.grad))")

    def check(self, a):
        backwards = [b for b in a.by_kind.get("backward", ())
                     if b.loc is not None and (b.get("fresh") or b.get("accumulated"))]
        if a.count(backwards) < 2:
            return
        # a hand-written SGD: confirmed by the run (no torch optimizer, no tensor changed); a
        # blend into a copy (an EMA): the copy is no tracked tensor, the statement says it all
        by_hand = not a.optimizers and not any(b.get("updated_by_hand")
                                               for b in a.by_kind.get("backward", ()))
        times = a.backward_calls
        for path in dict.fromkeys(b.loc.path for b in backwards):
            for line, form, text, meant in a.source.discarded_updates(path):
                if form != "blend" and not by_hand:
                    continue
                if form == "blend":
                    message = (f"this assignment gives the loop variable {text} a new tensor (a "
                               f"blend of itself and the other model's parameter); the tensor "
                               f"{text} named keeps its value, so the copy this loop is meant to "
                               f"update (an EMA or a target network) never changes: it keeps its "
                               f"initial weights through the {times} backward calls of the run")
                elif form == "rebind":
                    message = (f"this assignment gives the loop variable {text} a new tensor; the "
                               f"parameter it named keeps its value: no parameter changed in "
                               f"{times} backward calls")
                elif form == "into_grad":
                    message = (f"`{text}` writes the update into the gradient, not into the "
                               f"parameter: the parameter keeps its value, and no parameter "
                               f"changed in {times} backward calls")
                else:
                    message = (f"{text}(...) returns a new tensor that nothing keeps; the "
                               f"parameter keeps its value: no parameter changed in {times} "
                               f"backward calls")
                fix = f"update the parameter in place, under torch.no_grad(): {meant}"
                steps = a.of_kind("step")
                if form == "blend":
                    fix = f"update the copy in place, under torch.no_grad(): {meant}"
                    source = (related(steps[0], "an optimizer step whose weights the copy was to follow")
                              if steps else related(backwards[0], "a backward of the model it follows"))
                else:
                    source = related(backwards[0], "the backward whose gradients it was to apply")
                yield self.finding(
                    message, Location(path, line), fix=fix,
                    related=(source,),
                    evidence={"statement": text, "form": form, "backwards": times})
