from __future__ import annotations

from ..analysis.modes import evaluation_backward
from ..findings import Severity
from .base import Rule, related


class BackwardInEvaluation(Rule):
    """
    ## What it does
    Finds `backward()` called in an evaluation pass: the model ran in eval mode with gradients
    on, a backward followed, and then `model.train()` switched it back for the update's own
    training forward and backward, and no `zero_grad()` clears its gradients before the next
    step: the step applies them. It points at that backward.

    ## Why is this bad?
    The gradients of a validation batch are added to `.grad` like any other. With the usual
    `zero_grad()` at the top of the training step they are thrown away — the pass only costs a
    backward and the memory of its graph. With `zero_grad()` after the step (or none before
    the next backward), the next update applies them: the model trains on the validation
    data, and the validation loss stops measuring anything.

    ## Example
    ```python
    model.eval()
    for x, y in val_loader:
        val_loss = loss_fn(model(x), y)
        val_loss.backward()
    model.train()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            val_loss = loss_fn(model(x), y)
    model.train()
    ```

    ## Stays silent on
    Validation under `torch.no_grad()`; an evaluation backward whose gradients `zero_grad()`
    clears before any step (wasted, or meant: a Grad-CAM map's hooks); an adversarial attack
    run in eval mode whose backward
    computes the input's gradient (PGD, FGSM); a model trained in eval mode throughout (frozen
    BatchNorm statistics: `train-in-eval-mode` and `frozen-bn-train-mode` look at those); an
    eval-mode pass whose backward is the update's own, with no `train()` before the step.
    Seen through the model's dropout and BatchNorm layers: a model without them has no eval
    mode to tell.
    """

    code = "GD305"
    slug = "backward-in-evaluation"
    severity = Severity.WARNING
    summary = ("backward() in an evaluation pass (eval mode, then train()) whose gradients the next "
               "step applies")
    fix = "compute the evaluation loss under torch.no_grad() and drop this backward()"

    def check(self, a):
        tl = a.modes
        applied = {b.seq for backwards in a.ledger.windows.values() for b in backwards}
        groups: dict = {}
        for f in tl.forwards:
            found = evaluation_backward(a, f)
            if found is not None and not found.purposeful:
                groups.setdefault(found.backward.loc, []).append(found)
        for loc, items in groups.items():
            leaked = [e for e in items if e.backward.seq in applied]
            if not leaked:
                continue  # thrown away by a clear: wasted, or meant (a Grad-CAM map's hooks)
            first = leaked[0]
            times = a.count(e.backward for e in leaked)
            train = first.train.loc.line if first.train.loc is not None else "?"
            message = (f"this backward() runs in an evaluation pass (eval mode; train() at line "
                       f"{train} switches back for the update) and nothing clears its gradients "
                       f"before the next step: the step adds them to the update's own, so the "
                       f"model trains on this data")
            if times > 1:
                message += f" ({times} times)"
            yield self.finding(
                message, loc,
                related=(related(first.forward.event, "the forward it backpropagates, in eval mode"),
                         related(first.train, "the train() that ends the evaluation pass"),
                         related(first.step, "the step that applies them")),
                step=a.step_number.get(first.step.seq),
                evidence={"backwards": times, "layers": [tl.name(m) for m in first.forward.modules]})
