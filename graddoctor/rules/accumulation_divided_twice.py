from __future__ import annotations

from ..analysis.windows import typical
from ..findings import Role, Severity
from ..trace import Location
from .base import Rule, related
from .ddp_average_redone import ddp_world, world_division
from .unscaled_accumulation import SCALE_INVARIANT

# what each framework's backward does with the loss while it accumulates k micro-batches
_DIVIDER = {
    "accelerate": "accelerator.backward() already divides the loss by gradient_accumulation_steps",
    "lightning": "Lightning already divides the loss by accumulate_grad_batches",
    "transformers": "the Trainer already divides the loss by gradient_accumulation_steps",
}
_FIX = {
    "accelerate": "backpropagate the loss undivided: accelerator.backward(loss) divides it by "
                  "gradient_accumulation_steps",
    "lightning": "return the loss undivided from training_step: "
                 "Trainer(accumulate_grad_batches=k) divides it",
    "transformers": "return the loss undivided from compute_loss: the Trainer divides it by "
                    "gradient_accumulation_steps",
}


def _is_square_of(factor: float | None, k: int) -> bool:
    return factor is not None and abs(factor * k * k - 1.0) <= 1e-6


class AccumulationDividedTwice(Rule):
    """
    ## What it does
    Finds gradient accumulation over k micro-batches whose loss, a single mean-reduced loss
    function, reaches backward divided by k twice (a factor of exactly 1/k²) in every window:
    the script divides by k and so does the framework's backward (accelerate's
    `accelerator.backward`, Lightning's `accumulate_grad_batches`, the transformers Trainer's
    `gradient_accumulation_steps`), or a hand-written loop divides twice
    (`loss = loss / k` and then `(loss / k).backward()`). The factor is read from the loss's
    autograd graph, as `unscaled-accumulation` reads it.

    ## Why is this bad?
    The accumulated gradient is the mean over the window divided by k once more: each update is
    k times smaller than the one the learning rate was chosen for (with SGD-like optimizers an
    effective learning rate k times smaller; a gradient-norm clip threshold k times looser).
    Adam-like optimizers largely cancel a constant factor, so there the finding is `info`
    unless gradients are clipped.

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(x), y) / 4
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)  # divides by gradient_accumulation_steps
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    One division by k (by the script or by the framework); a loss summed over the batch
    (`reduction="sum"`, `.sum()`) divided by the batch size and by k; several loss terms
    averaged (`(l1 + l2) / 2`) and then divided by k; a division by a computed tensor (a token
    count); windows whose factors differ.
    """

    code = "GD227"
    slug = "accumulation-divided-twice"
    severity = Severity.WARNING
    summary = "the loss of k accumulated micro-batches is divided by k twice: updates k times too small"
    fix = "divide the loss by the number of accumulation steps once"

    def check(self, a):
        clips = [e for e in a.of_kind("clip") if not e.get("norm_only")]
        for opt, windows in a.windows.items():
            k = typical([w.k for w in windows], [a.weight(w.step) for w in windows])
            if k is None or k < 2:
                continue
            judged = [w for w in windows if w.k == k]
            if not judged or not all(
                    _is_square_of(b.get("loss_scale_factor"), k) and b.get("loss_terms") == ["mean"]
                    for w in judged for b in w.group):
                continue
            w = judged[0]
            first = w.group[0]
            via = first.loc.via if first.loc is not None else ""
            loc, text = first.loc, None
            if loc is not None:
                assigned = a.source.loss_assignment(loc.path, loc.line, framework=bool(via))
                if assigned is not None and "/" in assigned[1]:
                    loc, text = Location(loc.path, assigned[0], loc.function), assigned[1]
            if text and k == ddp_world(a) and all(b.get("allreduce") is not None for b in w.group) \
                    and world_division(text.split("  #")[0]):
                continue  # loss / (k * world_size) of a DDP model: ddp-average-redone's
            cls = a.optimizer_class(opt)
            owned = set(a.opt_params.get(opt, ()))
            clipped = any(owned.intersection(c["params"]) for c in clips)
            severity = Severity.INFO if cls in SCALE_INVARIANT and not clipped else None
            who = _DIVIDER.get(via, f"it is divided by {k} once more on its way to backward()"
                               if text else f"the loss is divided by {k} twice on its way to backward()")
            said = f"`{text}` divides by {k}, and " if text else ""
            message = (f"{k} backward() calls accumulate per {a.optimizer_name(opt)} step; "
                       f"{said}{who}: the loss reaches backward() multiplied by 1/{k * k}, so the "
                       f"update is the window's mean gradient divided by {k} again"
                       + (f" (with {cls}, a {k}x smaller learning rate)"
                          if cls not in SCALE_INVARIANT else
                          f" ({cls} largely cancels a constant factor, but the clip threshold is "
                          f"{k}x looser)" if clipped else
                          f" ({cls} largely cancels a constant factor, so the update changes "
                          f"little; it matters once you clip gradients or switch optimizer)"))
            yield self.finding(
                message, loc, severity=severity, step=w.index,
                fix=_FIX.get(via, f"divide the loss by {k} once, where the window is accumulated"),
                fixes={},
                related=(related(w.step, "the step that applies the accumulated sum", Role.STEP),),
                evidence={"k": k, "loss_scale_factor": first.get("loss_scale_factor"),
                          "optimizer": opt, "optimizer_class": cls, "framework": via,
                          "clipped": clipped, "windows": a.count(w.step for w in judged)})
