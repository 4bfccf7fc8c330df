from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, related
from .source import method_calls, receiver, related_line


def _next(a, after: int, kinds: tuple[str, ...], opts: set) -> object:
    for e in a.after(after):
        if e.kind in kinds and e.get("opt") in opts:
            return e
    return None


class ClipBeforeUnscale(Rule):
    """
    ## What it does
    Finds gradient clipping (`clip_grad_norm_`, `clip_grad_value_`) on gradients produced by
    `scaler.scale(loss).backward()` before `scaler.unscale_(optimizer)` has divided the scale
    out. It also fires when the `GradScaler` is disabled in this run (`torch.cuda.amp.GradScaler()`
    on a machine without CUDA): the order is wrong, and the bug bites as soon as it is enabled.

    ## Why is this bad?
    The gradients are still multiplied by the loss scale (65536 at first, adapting later), so
    `max_norm` is compared with a norm thousands of times too large: clipping rescales almost
    every step to a tiny fraction of `max_norm`, which acts like an erratic, much smaller
    learning rate. `clip_grad_value_` is off by the same factor. Nothing crashes.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)      # knows the grads are unscaled already
    scaler.update()
    ```

    ## Stays silent on
    `unscale_` → clip → step → update (with the old `torch.cuda.amp.GradScaler` too); a
    disabled scaler; unscale and clip once at the accumulation boundary; hand-written
    clipping after `unscale_`; hand-written static loss scaling undone before the step;
    steps the GradScaler skips; the frameworks' clipping (Lightning, accelerate, the
    transformers Trainer).
    """

    code = "GD201"
    slug = "clip-before-unscale"
    severity = Severity.ERROR
    summary = "gradients are clipped while still multiplied by the GradScaler's scale"
    fix = "call scaler.unscale_(optimizer) right before clipping"
    fixes = {
        "accelerate": ("clip with accelerator.clip_grad_norm_(...) (or clip_grad_value_): it "
                       "unscales the gradients first"),
        "lightning": ("let Lightning clip: Trainer(gradient_clip_val=...), or "
                      "self.clip_gradients(opt, gradient_clip_val=...) in manual optimization; "
                      "both unscale first"),
    }

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``scaler.unscale_(optimizer)`` right before the clip (a later ``unscale_`` of the
        same update moves there: a second one in one update raises)."""
        clip = src.statement_at(finding.location.line)
        backward_line = related_line(finding, Role.SCALED_BACKWARD)
        if clip is None or backward_line is None:
            return None
        scales = method_calls(src, "scale", line=backward_line)
        if not scales:
            return None
        scaler = receiver(src, scales[0])
        steps = [c for c in method_calls(src, "step") if receiver(src, c) == scaler and c.args
                 and src.span(c)[0] > clip.line]
        if not steps:
            return None
        opt = src.code(steps[0].args[0].value)
        later = related_line(finding, Role.UNSCALE)
        edits = [src.insert_before(clip, f"{scaler}.unscale_({opt})")]
        if later is not None and method_calls(src, "unscale_", line=later):
            old = src.statement_at(later)
            if old is None or src.only_statement(old):
                return None
            edits.append(src.delete(old))
        return self.edit(f"unscale the gradients before clipping: {scaler}.unscale_({opt})", *edits)

    def check(self, a):
        groups: dict = {}
        for state in a.ledger.clips:
            if state.scaled:
                hits = list(state.scaled)
                groups.setdefault(state.clip.loc, []).append((state.clip, hits, state.scaled[hits[0]]))
        for loc, items in groups.items():
            clip, hits, backward = items[0]
            opts = set().union(*(a.owners.get(pid, set()) for pid in hits)) or {None}
            later = _next(a, clip.seq, ("unscale", "scaler_step", "step"), opts)
            enabled = backward.get("scaler_enabled", True)
            scale = backward.get("scale")
            edited = set(clip.get("edited", ())) & set(hits)
            limit = clip.get("limit")
            if not enabled:
                why = ("the GradScaler is disabled in this run (it turns itself off without CUDA), so "
                       "these gradients happen not to be scaled here; once it is enabled, this clip sees "
                       "gradients multiplied by the loss scale")
            else:
                why = (f"they are still multiplied by the loss scale ({scale:g})" if isinstance(scale, float)
                       else "they are still multiplied by the loss scale")
                why += (f", so max_norm={limit:g} is compared with a norm that many times too large"
                        if isinstance(limit, float) and clip.get("via") != "clip_grad_value_" else "")
            message = (f"this clip runs on the gradients of {a.names(hits)} from scaler.scale(loss)"
                       f".backward() before scaler.unscale_(optimizer): {why}")
            severity = None
            if edited:
                severity = Severity.INFO
                message += ("; the gradients were changed in place before the clip — if that was a "
                            "hand-written unscale, ignore this")
            yield self.finding(
                message, loc, severity=severity,
                related=(related(backward, "the scaled backward that produced these gradients",
                                 Role.SCALED_BACKWARD),
                         related(later, "scaler.unscale_ comes only here" if later is not None
                                 and later.kind == "unscale" else "scaler.step() unscales only here",
                                 Role.UNSCALE if later is not None and later.kind == "unscale"
                                 else Role.STEP)),
                step=a.next_step_number(clip.seq),
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(hits)],
                          "scale": scale, "scaler_enabled": enabled, "clip": clip.get("via"),
                          "limit": limit, "total_norm": clip.get("total_norm"),
                          "occurrences": a.count(i[0] for i in items)},
            )
