from __future__ import annotations

from ..analysis import written
from ..findings import Safety, Severity
from .base import Rule, related
from .source import method_calls


class DoubleStep(Rule):
    """
    ## What it does
    Finds an optimizer stepped twice with nothing in between: no `backward()` wrote any of its
    parameters, no `zero_grad()` cleared them and no code changed their gradients, yet the
    gradients are still there. Typical causes: `scaler.step(optimizer)` followed by a leftover
    `optimizer.step()`, or `optimizer.step()` called both in the loop and in a helper.
    `optimizer.step(closure)` (L-BFGS) recomputes its gradients inside the step and is left
    alone, as are two optimizers over different parameters and wrappers (Lookahead, SWA) that
    step their inner optimizer once.

    ## Why is this bad?
    The second step applies the same gradients again: each update moves the weights twice (with
    SGD exactly twice as far; with momentum or Adam the moments count the batch twice), so the
    effective learning rate is doubled and the optimizer's step counters (Adam's bias
    correction, schedulers counting steps) run twice as fast. With a GradScaler, the extra
    `optimizer.step()` also bypasses the scaler: gradients it refused for inf/NaN are applied.
    Nothing crashes; training is merely less stable than the hyper-parameters promise.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.step(optimizer)
        optimizer.step()        # left over from before AMP: steps again
        scaler.update()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.step(optimizer)  # steps the optimizer itself (unless it found inf/NaN)
        scaler.update()
    ```

    ## Stays silent on
    L-BFGS's `step(closure)`; a Lookahead wrapper and its inner optimizer; two optimizers
    (or one GradScaler over two) each stepped once per update; gradients assigned by hand
    before each step (evolution strategies); SAM's two backward passes and one step; SWA's
    `update_parameters` and `SWALR` after the step; optimizers stepped inside the backward;
    accelerate's and FSDP's own steps.
    """

    code = "GD108"
    slug = "double-step"
    severity = Severity.ERROR
    summary = "the same optimizer is stepped twice on the same gradients"
    fix = ("step each optimizer once per update: remove the extra optimizer.step() "
           "(scaler.step(optimizer) already calls it)")

    fix_safety = Safety.UNSAFE  # which of the two steps to keep is the author's call

    def autofix(self, finding, src):
        """Delete the second step of the same gradients (unsafe: check that the other one is
        the step you meant to keep)."""
        s = src.statement_at(finding.location.line)
        if s is None or len(s.node.body) != 1 or src.only_statement(s) or \
                len(method_calls(src, "step", within=s)) != 1:
            return None
        return self.edit("remove the second step of the same gradients", src.delete(s))

    def check(self, a):
        # opt -> its latest plain step, while nothing has touched its gradients since
        last: dict[int, object] = {}
        groups: dict = {}
        for e in a.events:
            kind = e.kind
            if kind == "backward":
                for pid in written(e):
                    for opt in a.owners.get(pid, ()):
                        last.pop(opt, None)
            elif kind == "clear":
                for pid in e.get("params") or ():
                    for opt in a.owners.get(pid, ()):
                        last.pop(opt, None)
                last.pop(e.get("opt"), None)
            elif kind == "grad_edit":
                last.pop(e.get("opt"), None)
            elif kind == "step":
                opt = e["opt"]
                if e.get("closure"):  # L-BFGS: the closure's backwards run inside the step
                    last.pop(opt, None)
                    continue
                prev = last.get(opt)
                if prev is not None and not e.get("skipped"):
                    applied = self._with_grad(a, opt, e)
                    if applied:
                        key = (e.loc.path, e.loc.line) if e.loc else None
                        groups.setdefault(key, []).append((prev, e, applied))
                last[opt] = e
        for items in groups.values():
            prev, step, applied = items[0]
            yield self._finding(a, prev, step, applied, a.count(i[1] for i in items))

    @staticmethod
    def _with_grad(a, opt: int, step) -> list[int]:
        """The optimizer's parameters that hold a gradient at this step."""
        without = set(step.get("without_grad") or ())
        return [pid for pid in dict.fromkeys(a.opt_params.get(opt, ())) if pid not in without]

    def _finding(self, a, prev, step, applied: list[int], occurrences: int):
        opt = step["opt"]
        name = a.optimizer_name(opt)
        via_scaler = any(e.kind == "scaler_step" and e.get("opt") == opt
                         for e in a.after(prev.seq) if e.seq < step.seq)
        where = f"line {prev.loc.line}" if prev.loc else "its previous step"
        if via_scaler:
            first = f"scaler.step({name}) at {where} already stepped it"
        else:
            first = f"it was already stepped at {where}"
        if prev.get("skipped"):
            what = ("GradScaler skipped the previous step because these gradients hold inf/NaN; "
                    "this step applies them anyway, bypassing the scaler")
        else:
            what = (f"this step applies the same gradients of {a.names(applied)} a second time, "
                    f"so every update moves the weights twice")
        message = (f"{name} is stepped again with no backward(), zero_grad() or gradient change "
                   f"since {first}: {what}")
        if occurrences > 1:
            message += f" ({occurrences} times in the replay)"
        return self.finding(
            message, step.loc, step=a.step_number.get(step.seq),
            related=(related(prev, "the step that already applied these gradients"
                             if not prev.get("skipped") else "the step GradScaler skipped"),),
            evidence={"optimizer": opt, "optimizer_class": a.optimizer_class(opt),
                      "params": a.param_names(applied, limit=8), "via_scaler": via_scaler,
                      "first_skipped": bool(prev.get("skipped")), "occurrences": occurrences},
        )
