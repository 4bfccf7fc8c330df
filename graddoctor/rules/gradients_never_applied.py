from __future__ import annotations

from ..analysis.basics import written
from ..findings import Role, Severity
from .base import Rule, related
from .grads_cleared_before_step import GradsClearedBeforeStep
from .misplaced_zero_grad import MisplacedZeroGrad
from .optimizers_swapped import OptimizersSwapped
from .step_before_backward import StepBeforeBackward


class GradientsNeverApplied(Rule):
    """
    ## What it does
    Finds an optimizer that steps again and again while none of its steps applies a gradient
    a backward computed: every gradient the backwards write into its parameters is cleared
    before a step runs, and the steps run on empty (or zeroed) gradients. It reads the
    gradient ledger (analysis/ledger.py: which backward's gradients each step applies for the
    first time) over the replay: two steps or more after the first backward that wrote the
    optimizer's parameters, none with a gradient to apply, and a clear that dropped them. The
    cause is in the loop's layout, whatever it is: `optimizer.step()` in the batch loop while
    `backward()` runs once per epoch on a summed loss, a step called from a helper before the
    backward, `zero_grad()` at the top of the epoch discarding the gradients of the epoch
    before. It points at the step, with the backward and the clear as related lines.

    ## Why is this bad?
    A step with no gradient moves nothing (a None `.grad` is skipped; a zeroed one moves the
    weights by momentum and weight decay only), and the gradients the backward computes are
    thrown away by the next `zero_grad()` before any step sees them. The loss is computed and
    printed, and it does not go down: the model never trains. Nothing fails.

    ## Example
    ```python
    for epoch in range(epochs):
        optimizer.zero_grad()
        total = 0
        for x, y in loader:
            total = total + criterion(model(x), y)
            optimizer.step()           # no gradient exists yet
        total.backward()               # cleared by the next epoch's zero_grad()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    ```

    ## Stays silent on
    Steps that apply a backward's gradients at least once after the first backward (the usual
    loop, gradient accumulation, an update delayed by one pass: step → zero_grad → forward →
    backward, a partial accumulation window dropped at an epoch's end); closure steps (L-BFGS)
    and steps a GradScaler skipped; steps a training framework makes (Lightning steps without
    a backward when `training_step` returns None); an optimizer with fewer than two steps after the first
    backward (the replay ended); parameters another optimizer also steps; the layouts that
    `step-before-backward`, `misplaced-zero-grad`, `grads-cleared-before-step` and
    `optimizers-swapped` report (this rule stays quiet when one of them speaks); an optimizer
    whose parameters no backward wrote (`param-without-grad`, `optimizer-group-frozen`).
    """

    code = "GD290"
    slug = "gradients-never-applied"
    severity = Severity.ERROR
    summary = ("an optimizer keeps stepping but none of its steps applies a gradient: each "
               "backward's gradients are cleared before a step runs")
    fix = ("step right after the backward that computes the gradients (zero_grad → forward → "
           "backward → step in the loop that steps)")

    def check(self, a):
        applied = a.applied_steps
        if not applied:
            return
        backwards = a.of_kind("backward")
        clears = a.of_kind("clear")
        windows = a.ledger.windows
        quiet = None
        for opt, steps in applied.items():
            if opt in a.replaced:
                continue
            owned = set(a.opt_params.get(opt, ()))
            if not owned or any(a.owners.get(pid, {opt}) != {opt} for pid in owned):
                continue  # shared with another optimizer: its steps may consume them first
            first = next((b for b in backwards if owned.intersection(written(b))), None)
            if first is None:
                continue
            after = [s for s in steps if s.seq > first.seq]
            if a.count(after) < 2 or any(windows.get(s.seq) for s in after):
                continue
            if any(s.loc is None or s.loc.via or s.loc.hook for s in after):
                continue  # a training framework makes the steps (Lightning steps a skipped batch)
            clear = next((c for c in clears if c.seq > first.seq
                          and owned.intersection(c.get("params") or ())), None)
            if clear is None or clear.seq > after[0].seq:
                continue  # no clear dropped the first backward's gradients before a step
            if quiet is None:
                quiet = any(True for rule in (StepBeforeBackward(), MisplacedZeroGrad(),
                                              GradsClearedBeforeStep(), OptimizersSwapped())
                            for _ in rule.check(a))
            if quiet:
                return
            yield self._finding(a, opt, owned, first, clear, after)

    def _finding(self, a, opt, owned, backward, clear, after):
        step = after[0]
        pids = [p for p in written(backward) if p in owned]
        none = all(set(pids) <= set(s.get("without_grad") or ()) for s in after)
        times = a.count(after)
        back_line = backward.loc.line if backward.loc else "?"
        clear_line = clear.loc.line if clear.loc else "?"
        state = ("with every .grad None, so it skips the parameters" if none else
                 "with zeroed gradients, so only momentum or weight decay move the weights")
        return self.finding(
            f"none of the {times} steps of {a.optimizer_name(opt)} after the backward at line "
            f"{back_line} applies a gradient it computed: the clear at line {clear_line} drops "
            f"the gradients of {a.names(pids)} before any step runs, and each step runs {state}. "
            f"The loss is computed, the model never trains",
            step.loc,
            related=(related(backward, "the backward whose gradients no step applies", Role.BACKWARD),
                     related(clear, "the clear that drops them before the next step")),
            step=a.step_number.get(step.seq),
            evidence={"optimizer": opt, "params": a.param_names(pids[:8]), "steps": times,
                      "grads_none": none},
        )
