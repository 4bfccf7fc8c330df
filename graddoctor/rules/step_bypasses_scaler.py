from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, plural, related


def in_scaler_step(a, step) -> bool:
    """The step ran inside ``scaler.step(optimizer)``: a ``scaler_step`` of the same optimizer
    follows it before any other step or backward (a fused optimizer is handed the scale and
    unscales inside its own step, with no ``unscale`` event)."""
    for ahead in range(1, 9):  # GradScaler.step records its event right after the step's own
        e = a.event(step.seq + ahead)
        if e is None:
            continue  # not in this (folded) trace
        if e.kind in ("step", "step_begin", "backward"):
            return False
        if e.kind == "scaler_step":
            return e.get("opt") == step["opt"]
    return False


def bypassing_steps(a) -> list:
    """The ledger's steps that applied gradients of an enabled GradScaler's scaled backward that
    nothing unscaled, outside ``scaler.step``: the update is multiplied by the loss scale."""
    return [s for s in a.ledger.scaled_steps
            # a scaled backward names its scaler and whether it is enabled; one that does not
            # (a trace written without them) is not judged
            if any(b.get("scaler_enabled") is True for b in s.scaled.values())
            and not in_scaler_step(a, s.step)]


class StepBypassesScaler(Rule):
    """
    ## What it does
    Finds an `optimizer.step()` that applies the gradients of `scaler.scale(loss).backward()`
    directly, without `scaler.step(optimizer)` or `scaler.unscale_(optimizer)` in between. It is
    reported at the step, the line to change.

    A step run by `scaler.step(optimizer)` (also a fused optimizer that unscales inside its own
    step) is fine, and so is a GradScaler disabled in this run (`enabled=False`, or
    `torch.cuda.amp.GradScaler()` without CUDA): its "scaled" loss is the loss itself, and a
    script may step the optimizer directly on that path on purpose. When the gradients were
    changed in place between the backward and the step (perhaps a hand-written unscale), the
    finding is only an `info`.

    ## Why is this bad?
    `scaler.scale(loss)` multiplies the loss by the scale (65536 at first), so every gradient is
    65536 times too large until `scaler.unscale_` or `scaler.step` divides it back. A plain
    `optimizer.step()` applies the multiplied gradients: an SGD update 65536 times too large
    (the loss explodes and turns NaN within a few steps), and with Adam a wrong epsilon and
    weight-decay balance. Nothing skips the steps whose gradients overflowed either, which is
    the other half of what `scaler.step` does.

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    optimizer.step()              # applies gradients multiplied by the scale
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)        # unscales, skips the step if it finds inf/NaN
    scaler.update()               # adapts the scale
    ```

    ## Stays silent on
    `scaler.step(opt)`; a fused optimizer unscaling inside its step; a disabled scaler with
    a plain step on that path; hand-written static loss scaling undone before the step; a
    second model trained without AMP with its own plain backward and optimizer.
    """

    code = "GD214"
    slug = "step-bypasses-scaler"
    severity = Severity.ERROR
    summary = ("optimizer.step() applies gradients still multiplied by the GradScaler's scale "
               "(scaler.step(optimizer) bypassed)")
    fix = "replace optimizer.step() with scaler.step(optimizer) followed by scaler.update()"

    def check(self, a):
        groups: dict = {}
        for item in bypassing_steps(a):
            groups.setdefault(item.step.loc, []).append(item)
        nonfinite = {e.seq for e in a.of_kind("step_begin") if e.get("nonfinite")}
        for loc, items in groups.items():
            first = items[0]
            step = first.step
            pids = list(first.scaled)
            plain = [p for p in pids if p not in first.edited]
            backward = first.scaled[pids[0]]
            scale = backward.get("scale")
            times = f"{scale:g}" if isinstance(scale, float) else "the loss scale"
            occurrences = a.count(i.step for i in items)
            name = a.optimizer_name(step["opt"])
            message = (f"this step applies the gradients of {a.names(plain or pids)} straight from "
                       f"scaler.scale(loss).backward(): nothing unscaled them, so {name} applies "
                       f"gradients multiplied by {times}, and steps with inf/NaN gradients are "
                       f"not skipped ({plural(occurrences, 'step')})")
            bad = [i.step for i in items if self._nonfinite_before(a, i.step, nonfinite)]
            if bad and a.step_number.get(bad[0].seq) is not None:
                message += f"; the gradients are NaN/Inf from step {a.step_number[bad[0].seq]} on"
            severity = None
            if not plain:
                severity = Severity.INFO
                message += ("; they were changed in place before the step — if that was a "
                            "hand-written unscale, only the skipping of inf/NaN steps is missing")
            opt_var = (a.source.called_object(loc.path, loc.line, "step") if loc else None) or "optimizer"
            scaler_var = ((a.source.called_object(backward.loc.path, backward.loc.line, "scale")
                           if backward.loc else None) or "scaler")
            yield self.finding(
                message, loc, severity=severity, step=a.step_number.get(step.seq),
                related=(related(backward, "the scaled backward that produced these gradients", Role.SCALED_BACKWARD),),
                fix=(f"replace `{opt_var}.step()` with `{scaler_var}.step({opt_var})` followed by "
                     f"`{scaler_var}.update()`: it unscales the gradients first and skips a step "
                     f"whose gradients overflowed"),
                evidence={"params": a.param_names(plain or pids, limit=8), "scale": scale,
                          "optimizer": step["opt"], "edited": a.param_names(first.edited, limit=8),
                          "nonfinite_steps": a.count(bad), "occurrences": occurrences},
            )

    @staticmethod
    def _nonfinite_before(a, step, nonfinite: set) -> bool:
        """The step_begin right before this step found NaN/Inf gradients."""
        for back in range(1, 8):  # step_begin comes right before (a step's own events between)
            e = a.event(step.seq - back)
            if e is not None and e.kind == "step_begin" and e.get("opt") == step["opt"]:
                return e.seq in nonfinite
        return False
