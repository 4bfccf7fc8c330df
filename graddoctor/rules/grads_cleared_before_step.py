from __future__ import annotations

from ..analysis.basics import written
from ..findings import Severity
from ..trace import Location
from .base import Rule, related


class GradsClearedBeforeStep(Rule):
    """
    ## What it does
    Finds an optimizer whose every step applies nothing: between the backward that writes its
    parameters' gradients and the step, code of the script clears them all by hand
    (`p.grad = None`, `p.grad.zero_()`). It points at that statement when the script's source
    shows it between the two calls, else at the step.

    ## Why is this bad?
    `optimizer.step()` skips a parameter whose `.grad` is None and moves one whose gradient is
    zero by nothing (Adam's moments stay at zero too): each update throws away the gradients it
    was computed for. The loss is computed and printed every iteration, and the model never
    learns.

    ## Example
    ```python
    loss.backward()
    for p in model.parameters():
        p.grad = None
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    optimizer.step()
    for p in model.parameters():
        p.grad = None
    ```

    ## Stays silent on
    Gradients cleared by hand after the step or before the backward; some parameters' gradients
    cleared to keep them frozen (`p.grad = None` for a frozen part); a step skipped now and then
    (a bad batch whose gradients are dropped); gradients the step finds zero without any edit
    (a loss that does not depend on them: `param-without-grad` and the flow checks look there);
    steps whose gradients were vouched finite by a clip or `unscale_` (their norms are not read
    again).
    """

    code = "GD122"
    slug = "grads-cleared-before-step"
    severity = Severity.ERROR
    summary = "gradients cleared by hand between backward() and step(): every step applies nothing"
    fix = "clear the gradients after optimizer.step() (or before the backward), not between them"

    def check(self, a):
        windows = a.ledger.windows
        for opt, steps in a.applied_steps.items():
            if a.count(steps) < 2:
                continue
            owned = set(a.opt_params.get(opt, ()))
            hits = []
            for step in steps:
                hit = self._cleared(a, step, owned, windows.get(step.seq))
                if hit is None:
                    break  # only an optimizer none of whose steps applies anything
                hits.append(hit)
            else:
                yield self._finding(a, opt, steps, hits)

    def _cleared(self, a, step, owned: set, window):
        """``(how, pids, last backward)`` when every gradient of ``owned`` the step's window
        wrote was None (``"none"``) or edited to zero (``"zero"``) at the step; else None."""
        if not window:
            return None
        pids = list(dict.fromkeys(p for b in window for p in written(b) if p in owned))
        if not pids:
            return None
        last = window[-1]
        if set(pids) <= set(step.get("without_grad") or ()):
            return "none", pids, last
        norms, edited = a.measured_at(step, last.seq)
        if norms is None:
            return None
        if all(norms.get(p) == 0.0 and p in edited for p in pids):
            return "zero", pids, last
        return None

    def _finding(self, a, opt, steps, hits):
        how, pids, backward = hits[0]
        step = steps[0]
        cls = a.optimizer_class(opt) or "the optimizer"
        state = "None" if how == "none" else "zero"
        loc = step.loc
        clears = []
        if backward.loc is not None and step.loc is not None and backward.loc.path == step.loc.path \
                and backward.loc.line < step.loc.line:
            clears = a.source.grad_clears(step.loc.path, backward.loc.line + 1, step.loc.line - 1)
        if clears:
            loc = Location(step.loc.path, clears[0][0])
        times = a.count(steps)
        where = f"this `{clears[0][1]}` clears" if clears else "code between backward() and this step clears"
        message = (f"{where} every gradient the backward at line "
                   f"{backward.loc.line if backward.loc else '?'} just wrote ({a.names(pids)}): "
                   f"each of the {times} steps of {cls} finds them {state} and applies nothing, "
                   f"so the model never trains")
        return self.finding(
            message, loc,
            related=(related(backward, "the backward whose gradients are thrown away"),
                     related(step, "the step that finds them cleared") if clears else None),
            step=a.step_number.get(step.seq),
            evidence={"params": a.param_names(pids), "cleared_to": state, "steps": times},
            fix=(f"move `{clears[0][1]}` after optimizer.step() (or before the backward)" if clears
                 else None))
