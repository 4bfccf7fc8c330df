from __future__ import annotations

from ..findings import Severity
from ..ledger import ledger_of
from .base import Rule, names, related


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

    def check(self, trace):
        led = ledger_of(trace)
        clipped: dict[int, object] = {}  # pid -> the clip whose result a later backward may add to
        groups: dict = {}
        for e in trace:
            kind = e.kind
            if kind == "clip" and not e.get("norm_only"):
                for pid in e["params"]:
                    if pid in led.owners:
                        clipped[pid] = e
            elif kind == "backward":
                hits: dict = {}
                for pid in e.get("accumulated", ()):
                    clip = clipped.pop(pid, None)
                    if clip is not None:
                        hits.setdefault(clip.seq, (clip, []))[1].append(pid)
                for clip, pids in hits.values():
                    groups.setdefault(clip.loc, []).append((clip, e, sorted(pids)))
                for pid in (*e.get("fresh", ()), *e.get("cleared_outside", ())):
                    clipped.pop(pid, None)
            elif kind == "clear":
                for pid in e["params"]:
                    clipped.pop(pid, None)
            elif kind == "step":
                for pid in led.opt_params.get(e["opt"], ()):
                    clipped.pop(pid, None)
        for loc, items in groups.items():
            clip, backward, pids = items[0]
            step = next((s for s in led.steps if s.seq > backward.seq), None)
            yield self.finding(
                f"this clip runs before the last micro-batch of the update: a later backward() adds "
                f"more gradient to {names(trace, pids)} before the optimizer step, so the update is "
                f"not the clipped one (seen {len(items)} time(s))",
                loc,
                related=(related(backward, "a later backward adds to the clipped gradients"),
                         related(step, "the step that applies the partly clipped sum")),
                step=next((i for i, s in enumerate(led.steps, 1) if s.seq > backward.seq), None),
                evidence={"params": [trace.param_name(p) for p in dict.fromkeys(pids)],
                          "clip": clip.get("via"), "limit": clip.get("limit"),
                          "occurrences": len(items)},
            )
