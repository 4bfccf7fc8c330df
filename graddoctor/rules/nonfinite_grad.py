from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, plural, related
from .step_bypasses_scaler import bypassing_steps
from .updates_diverge import lower_lr


class NonfiniteGrad(Rule):
    """
    ## What it does
    Finds optimizer steps that apply NaN or infinite gradients: right before the step, the norm
    of some parameter's gradient is not finite. Names the first such parameters and the backward
    that produced them. Steps that `GradScaler` skipped because of those inf/NaN values are
    fine: that is the scaler doing its job.

    ## Why is this bad?
    One NaN gradient turns the parameters into NaN (SGD) or poisons the optimizer's running
    moments for good (Adam): the loss becomes NaN a step or two later and training never
    recovers. Typical causes: `log(0)`, `sqrt` of 0 in a norm, division by a zero count, fp16
    overflow without a `GradScaler`, a learning rate that blows up.

    ## Example
    ```python
    loss = -(torch.log(probs) * targets).sum()     # probs can be exactly 0
    loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss = -(torch.log(probs.clamp_min(1e-12)) * targets).sum()   # or F.cross_entropy on logits
    loss.backward()
    optimizer.step()
    ```

    ## Stays silent on
    Inf steps that GradScaler skips (and steps step-bypasses-scaler already names); a fused
    optimizer unscaling inside its step; a step skipped by the script when the clip returns
    a non-finite norm; hand-written loss scaling checked for overflow.
    """

    code = "GD207"
    slug = "nonfinite-grad"
    severity = Severity.ERROR
    summary = "NaN/Inf gradients reach an optimizer step"
    fix = "find the NaN/Inf source (log/sqrt/div of 0, overflow); with fp16 use a GradScaler"
    # a script that already scales its loss with a GradScaler is not told to use one
    fix_with_scaler = "find the NaN/Inf source (log/sqrt/div of 0, overflow, a learning rate too large)"

    def check(self, a):
        index = a.step_number
        # steps that applied still-scaled gradients: step-bypasses-scaler names that cause
        explained = {s.step.seq for s in bypassing_steps(a) if len(s.edited) < len(s.scaled)}
        begins: dict[int, object] = {}
        hits = []  # (step_begin, step)
        for e in a.events:
            if e.kind == "step_begin" and not e.get("closure"):
                begins[e["opt"]] = e
            elif e.kind == "step":
                begin = begins.pop(e["opt"], None)
                if (begin is not None and begin.get("nonfinite") and not e.get("skipped")
                        and e.seq not in explained):
                    hits.append((begin, e))
            elif e.kind == "scaler_step" and e.get("found_inf") and hits:
                # a fused optimizer was handed the inf check and skipped inside its own step
                if hits[-1][1]["opt"] == e["opt"] and hits[-1][1].seq < e.seq:
                    hits.pop()
        backwards = a.of_kind("backward")
        # the GradScaler advice only where half precision runs without one
        fix = (None if any(b.get("autocast_fp16") and not b.get("scaled") for b in backwards)
               or a.by_kind.get("low_precision") else self.fix_with_scaler)
        diverged = {e.get("opt"): e for e in a.by_kind.get("diverging", ())}
        # a cause that is knowable: an optimizer whose eps rounds to 0 in its parameters' dtype
        eps_zero = {e.get("opt"): e for e in a.of_kind("low_precision") if e.get("what") == "eps"}
        groups: dict = {}
        for begin, step in hits:
            first = begin["nonfinite"][0]
            source = a.last_writer(first, before=begin.seq)
            groups.setdefault(source.loc if source else step.loc, []).append((begin, step, source))
        for loc, items in groups.items():
            begin, step, source = items[0]
            affected = a.count(s for _, s, _ in items)  # folded copies included
            bad = begin["nonfinite"]
            norms = dict(zip(begin.get("norm_pids", ()), begin.get("norms", ())))
            where = "this backward produced" if source is not None else "this step applies"
            cause, cause_fix = "", fix
            low = next((eps_zero[s["opt"]] for _, s, _ in items if s["opt"] in eps_zero), None)
            if low is not None and low.seq < step.seq:
                cause = (f"; the likely cause: {a.optimizer_name(low['opt'])}'s eps={low['eps']:g} "
                         f"rounds to 0 in {low['dtype']}, so an earlier update divided by zero "
                         "where the second moment underflowed (see low-precision-update)")
                cause_fix = (f"keep float32 parameters (torch.autocast for the compute), or an eps "
                             f"{low['dtype']} can hold (eps=1e-4)")
            grew = diverged.get(step["opt"])
            if grew is not None and grew.seq < step.seq and not cause:
                first_norm, last_norm = grew.get("norms") or (0.0, 0.0)
                cause = (f"; before it the gradient norm grew about {grew.get('factor'):.3g}x per "
                         f"update ({first_norm:.3g} -> {last_norm:.3g}): the updates diverged")
                summed = source is not None and "sum" in (source.get("loss_terms") or ())
                cause_fix = (f"lower the learning rate{lower_lr(begin.get('lrs'))}, or "
                             + ("average the loss over the batch (reduction='mean')" if summed
                                else "normalise the inputs and targets") + "; see updates-diverge")
            yield self.finding(
                f"{where} NaN/Inf gradients in {a.names(bad)}, and "
                f"{a.optimizer_name(step['opt'])} applied them at step {index.get(step.seq)} "
                f"({plural(affected, 'step')} affected){cause}",
                loc, step=index.get(step.seq), fix=cause_fix,
                related=(related(step, "the step that applies them", Role.STEP),) if source is not None else (),
                evidence={"params": [a.param_name(p) for p in bad[:8]], "count": len(bad),
                          "norms": {a.param_name(p): str(norms.get(p)) for p in bad[:8]},
                          "steps_affected": affected},
            )
