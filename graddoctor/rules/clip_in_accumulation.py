from __future__ import annotations

from ..findings import Severity
from .base import Rule, related, times


class ClipInAccumulation(Rule):
    """
    ## What it does
    Finds gradient clipping that runs in the middle of a gradient-accumulation window: after the
    clip, another `backward()` still adds to the same gradients before the optimizer step uses
    them.

    ## Why is this bad?
    Clipping is meant for the gradient of the whole update. Clipping each micro-batch's partial
    sum bounds only the part accumulated so far: the later micro-batches are added unclipped,
    and the early ones are shrunk by a factor that depends on how far into the window the clip
    ran. The update's norm is neither bounded nor the one you would get without accumulation.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # once, at the boundary
            optimizer.step()
            optimizer.zero_grad()
    ```
    """

    code = "GD202"
    slug = "clip-in-accumulation"
    severity = Severity.WARNING
    summary = "gradients are clipped while a later backward still adds to the same update"
    fix = "clip once per update, right before optimizer.step() (after the last micro-batch's backward)"
    fixes = {
        "accelerate": ("clip only at the end of the window: if accelerator.sync_gradients: "
                       "accelerator.clip_grad_norm_(model.parameters(), max_norm)"),
        "lightning": ("let Lightning clip (Trainer(gradient_clip_val=...) clips once per update); "
                      "with manual optimization call self.clip_gradients(opt, ...) only on the "
                      "batch that steps"),
    }

    def check(self, a):
        groups: dict = {}
        for hit in a.ledger.clip_overwrites:
            groups.setdefault(hit.clip.loc, []).append((hit.clip, hit.backward, hit.pids))
        for loc, items in groups.items():
            clip, backward, pids = items[0]
            step = a.next_step(backward.seq)
            yield self.finding(
                f"this clip runs before the last micro-batch of the update: a later backward() adds "
                f"more gradient to {a.names(pids)} before the optimizer step, so the update is "
                f"not the clipped one (seen {times(a.count(i[0] for i in items))})",
                loc,
                related=(related(backward, "a later backward adds to the clipped gradients"),
                         related(step, "the step that applies the partly clipped sum")),
                step=a.next_step_number(backward.seq),
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "clip": clip.get("via"), "limit": clip.get("limit"),
                          "occurrences": a.count(i[0] for i in items)},
            )
