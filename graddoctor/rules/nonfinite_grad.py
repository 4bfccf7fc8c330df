from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, plural, related
from .step_bypasses_scaler import bypassing_steps


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
        fix = (self.fix_with_scaler if any(b.get("scaled") for b in a.of_kind("backward"))
               else None)
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
            yield self.finding(
                f"{where} NaN/Inf gradients in {a.names(bad)}, and "
                f"{a.optimizer_name(step['opt'])} applied them at step {index.get(step.seq)} "
                f"({plural(affected, 'step')} affected)",
                loc, step=index.get(step.seq), fix=fix,
                related=(related(step, "the step that applies them", Role.STEP),) if source is not None else (),
                evidence={"params": [a.param_name(p) for p in bad[:8]], "count": len(bad),
                          "norms": {a.param_name(p): str(norms.get(p)) for p in bad[:8]},
                          "steps_affected": affected},
            )
