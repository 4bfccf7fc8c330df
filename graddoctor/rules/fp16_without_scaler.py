from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class Fp16WithoutScaler(Rule):
    """
    ## What it does
    Finds a training loop that runs its forward under float16 autocast
    (`torch.autocast("cuda")`, whose default dtype is float16, or `dtype=torch.float16`) and
    backpropagates the loss without a `GradScaler`: no loss scaling at all. It points at the
    backward.

    ## Why is this bad?
    float16 cannot hold values below about 6e-8: the small gradients of the activations
    computed in float16 flush to zero in the backward (and large ones overflow to inf with
    nothing to catch it). Nothing crashes; parts of the model silently stop learning, or the
    loss stalls. This is why PyTorch's AMP recipe pairs float16 autocast with `GradScaler`,
    which multiplies the loss before backward and divides the gradients before the step.

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    ...
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    (or autocast to `torch.bfloat16`, whose range needs no scaling).

    ## Stays silent on
    bfloat16 autocast; float16 autocast with a `GradScaler` (the frameworks' fp16 precision
    settings use one); a hand-written static loss scale (`(loss * 1024).backward()` undone
    before the step); autocast used only under `torch.no_grad()` (evaluation); a disabled
    autocast (`enabled=False`, or `autocast("cuda")` on a machine without CUDA, unless
    `--emulate-cuda` runs the GPU path). A script that has a GradScaler but leaves one loss
    out of it is `unscaled-backward-under-scaler`'s.
    """

    code = "GD219"
    slug = "fp16-without-scaler"
    severity = Severity.WARNING
    summary = ("the loss of a float16 autocast forward is backpropagated without a GradScaler: "
               "small gradients underflow to zero")
    fix = ("scale the loss with a GradScaler: `scaler = torch.amp.GradScaler(\"cuda\")`, "
           "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()` (or "
           "autocast to torch.bfloat16)")

    def check(self, a):
        if a.by_kind.get("scaler_step") or a.by_kind.get("unscale") or a.by_kind.get("scaler_update"):
            return  # a GradScaler is in use: a loss left out of it is another rule's
        hits = [b for b in a.by_kind.get("backward", ())
                if b.get("autocast_fp16") and not b.get("scaled")
                and not ((b.get("loss_scale_factor") or 1.0) >= 2.0)]
        # most backwards, not one now and then: a float16 evaluation forward left with grad
        # on marks the next training backward although that one's forward ran in float32
        backwards = a.count(a.by_kind.get("backward", ()))
        if a.count(hits) < max(2, backwards // 2) or not any(s.seq > hits[0].seq for s in a.steps):
            return
        first = hits[0]
        path, line = first["autocast_fp16"][:2]
        autocast = Location(path, line)
        text = a.source.line_text(path, line)
        device = "cpu" if ('"cpu"' in text or "'cpu'" in text) else "cuda"
        yield self.finding(
            f"this backward propagates a loss computed under float16 autocast (line {line}) "
            f"without a GradScaler, {a.count(hits)} times: gradients below float16's range "
            f"(about 6e-8) flush to zero and nothing scales them back up",
            first.loc,
            related=(Related(autocast, "the float16 autocast of the forward"),),
            step=a.next_step_number(first.seq),
            evidence={"backwards": a.count(hits), "autocast_line": line},
            fix=self.fix.replace('"cuda"', f'"{device}"') if device != "cuda" else None)
