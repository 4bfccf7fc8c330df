from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, related, times
from .loss_scale_not_undone import _loss_scale
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

    The same holds for loss scaling written by hand: every backward of an update ran on the
    loss multiplied by a power of two of 1024 or more (`(loss * 1024).backward()`), and the
    clip comes before anything divided the gradients back (`p.grad.div_(1024)`): a warning at
    the clip.

    ## Stays silent on
    `unscale_` → clip → step → update (with the old `torch.cuda.amp.GradScaler` too); a
    disabled scaler; unscale and clip once at the accumulation boundary; hand-written
    clipping after `unscale_`; hand-written static loss scaling undone before the clip (`p.grad.div_(scale)`, then clip);
    a loss multiplied by a factor that is no power of two, or below 1024 (a loss weight);
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
        yield from self._scaled(a)
        yield from self._hand_scaled(a)

    def _hand_scaled(self, a):
        """A clip between backwards of a loss times a loss scale (a power of two >= 1024, no
        GradScaler) and the step, with nothing dividing the gradients before it."""
        clips = [e for e in a.of_kind("clip") if not e.get("norm_only")]
        edits = [e for e in a.of_kind("grad_edit", "unscale")]
        if not clips:
            return
        groups: dict = {}
        for opt, windows in a.windows.items():
            owned = set(a.opt_params.get(opt, ()))
            for w in windows:
                if w.step.get("skipped") or w.step.get("closure") or not w.group:
                    continue
                factors = {b.get("loss_scale_factor") for b in w.group}
                if len(factors) != 1 or not _loss_scale(next(iter(factors))):
                    continue
                if any(b.get("scaled") for b in w.group):
                    continue  # a GradScaler's backward: judged above
                first, last = w.group[0].seq, w.group[-1].seq
                clip = next((c for c in clips if last < c.seq < w.step.seq
                             and owned.intersection(c.get("params") or ())), None)
                if clip is None:
                    continue
                if owned.intersection(clip.get("edited") or ()):
                    continue  # the gradients were changed in place before the clip (p.grad.div_)
                if any(first < e.seq < clip.seq and (e.get("opt") == opt
                                                     or owned.intersection(e.get("params") or ()))
                       for e in edits):
                    continue  # divided back (or changed) before the clip
                groups.setdefault(clip.loc, []).append((clip, w, next(iter(factors))))
        for loc, items in groups.items():
            clip, w, factor = items[0]
            limit = clip.get("limit")
            hits = [pid for pid in clip.get("params") or () if pid in set(a.opt_params.get(w.step["opt"], ()))]
            bound = (f"max_norm={limit:g} is compared with a norm {factor:g} times too large, so "
                     f"nearly every update is clipped" if isinstance(limit, float)
                     and clip.get("via") != "clip_grad_value_" else
                     f"the clip value is compared with gradients {factor:g} times too large")
            occurrences = a.count(i[0] for i in items)
            yield self.finding(
                f"this clip runs on the gradients of {a.names(hits)} from a backward of the loss "
                f"multiplied by {factor:g} (a loss scale written by hand) before anything divided "
                f"them back: {bound} (seen {times(occurrences)})",
                loc, severity=Severity.WARNING,
                related=(related(w.group[-1], "the backward of the scaled loss"),
                         related(w.step, "the step that applies the clipped gradients", Role.STEP)),
                step=a.step_number.get(w.step.seq),
                evidence={"params": [a.param_name(p) for p in hits[:16]], "factor": factor,
                          "clip": clip.get("via"), "limit": limit, "occurrences": occurrences},
                fix=(f"divide the gradients by the loss scale before clipping (for p in params: "
                     f"p.grad.div_({factor:g})), or let torch.amp.GradScaler scale and unscale_"))

    def _scaled(self, a):
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
