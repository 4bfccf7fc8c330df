from __future__ import annotations

from ..findings import Severity
from .base import Rule, one_or_many, related


class EvalInTrainMode(Rule):
    """
    ## What it does
    Finds forwards that run BatchNorm layers in train mode under `torch.no_grad()` or
    `torch.inference_mode()` outside any training update — a validation or inference pass
    without `model.eval()`. It points at that forward call. Deliberate recalibration
    (`torch.optim.swa_utils.update_bn`, a pass after `reset_running_stats()`, `momentum=None`)
    and no-grad forwards inside an update (a GAN's fake batch, a teacher's targets) are not
    reported.

    ## Why is this bad?
    In train mode BatchNorm normalises with the statistics of the validation batch and writes
    them into `running_mean` / `running_var`: the validation data leaks into the model, the
    metrics are computed with batch statistics (and with dropout on), and the next evaluation
    uses statistics that no longer match the trained weights.

    ## Example
    ```python
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += loss_fn(model(x), y).item()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += loss_fn(model(x), y).item()
    model.train()
    ```
    """

    code = "GD303"
    slug = "eval-in-train-mode"
    severity = Severity.WARNING
    summary = "BatchNorm in train mode runs under no_grad outside training: validation without eval()"
    fix = "call model.eval() before the no-grad pass, and model.train() again before training"

    def check(self, a):
        tl = a.modes
        groups: dict = {}
        for f in tl.forwards:
            if f.context != "outside" or not f.training or f.grad:
                continue
            for mid in f.modules:
                state = f.states.get(mid) or {}
                if (state.get("layer") != "batchnorm" or not state.get("track_running_stats")
                        or mid in f.recalibrated):
                    continue
                group = groups.setdefault(f.event.loc, {"forward": f, "mids": []})
                if mid not in group["mids"]:
                    group["mids"].append(mid)
        for where, group in groups.items():
            f, mids = group["forward"], group["mids"]
            cause = next((c for c in (f.set_by.get(m) for m in mids) if c is not None and c.get("mode")), None)
            under = "torch.inference_mode()" if f.event.get("inference") else "torch.no_grad()"
            count = len(mids)
            layers = one_or_many(count, "a BatchNorm layer", f"{count} BatchNorm layers")
            their = one_or_many(count, "its", "their")
            dropout = any((f.states.get(m) or {}).get("layer") == "dropout" for m in f.modules)
            yield self.finding(
                f"this forward runs under {under} with {layers} in train mode ({tl.names(mids)}) "
                f"outside any training update: it overwrites {their} running statistics with this data "
                f"and normalises with batch statistics{' (and dropout stays on)' if dropout else ''} — "
                f"a validation pass without model.eval()",
                where,
                related=(related(cause, "train() here left the model in train mode"),),
                step=f.steps_before or None,
                evidence={"layers": [tl.name(m) for m in mids], "calls": f.event.get("calls", 1),
                          "inference_mode": bool(f.event.get("inference"))},
            )
