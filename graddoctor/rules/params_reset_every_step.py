from __future__ import annotations

from ..findings import Severity
from .base import Rule, related


class ParamsResetEveryStep(Rule):
    """
    ## What it does
    Finds parameters an optimizer steps that the script sets back between every two of its
    steps: re-initialised with `torch.nn.init` (a layer initialised in `forward`,
    `model.apply(init_weights)` inside the loop) or reloaded from the same, unchanged state
    dict (`model.load_state_dict(initial_state)` in the loop). It points at that call.

    ## Why is this bad?
    Each update is undone before the next one: the parameters never get further than one step
    from their initial (or random) values. The loss is computed and backpropagated every
    iteration, the optimizer steps, and the model does not learn.

    ## Example
    ```python
    def forward(self, x):
        nn.init.xavier_uniform_(self.fc.weight)
        return self.fc(x)
    ```

    ## Use instead
    ```python
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        nn.init.xavier_uniform_(self.fc.weight)

    def forward(self, x):
        return self.fc(x)
    ```

    ## Stays silent on
    Initialisation before the first step; a part re-initialised now and then (a new stage, dead
    units revived every N steps); a best checkpoint restored once; a new state loaded every step
    (federated averaging: the global weights change between rounds); a state dict loaded into a
    copy no optimizer owns (an EMA or SWA model).
    """

    code = "GD123"
    slug = "params-reset-every-step"
    severity = Severity.ERROR
    summary = ("stepped parameters are re-initialised or reloaded between every two steps: each "
               "update is undone")
    fix = ("initialise (or load) the parameters once, before the training loop, not in forward() "
           "or in the loop")

    def check(self, a):
        resets = a.by_kind.get("param_reset", ())
        if not resets:
            return
        by_opt: dict[int, list] = {}
        for step in a.steps:
            if not step.get("skipped"):
                by_opt.setdefault(step["opt"], []).append(step)
        for opt, steps in by_opt.items():
            if a.count(steps) < 3:
                continue
            owned = set(a.opt_params.get(opt, ()))
            hits = []
            for before, after in zip(steps, steps[1:]):
                found = [e for e in a.span(before.seq + 1, after.seq - 1)
                         if e.kind == "param_reset" and owned.intersection(e.get("params") or ())
                         and _undoes(e, resets)]
                if not found:
                    break
                hits.append((found[0], after))
            else:
                yield self._finding(a, opt, steps, hits)

    def _finding(self, a, opt, steps, hits):
        reset, step = hits[0]
        pids = list(dict.fromkeys(p for e, _ in hits for p in e.get("params") or ()
                                  if p in set(a.opt_params.get(opt, ()))))
        cls = a.optimizer_class(opt) or "the optimizer"
        how = ("reloads the same saved state into" if reset["via"] == "load_state_dict"
               else f"re-initialises ({reset['via'].rsplit('.', 1)[-1]})")
        times = a.count(steps)
        return self.finding(
            f"this call {how} {a.names(pids)} between every two of the {times} steps of {cls}: "
            f"each update is undone before the next, so the model never trains",
            reset.loc,
            related=(related(step, "a step whose update it undoes"),),
            step=a.step_number.get(step.seq),
            evidence={"params": a.param_names(pids), "via": reset["via"], "steps": times},
            fix=("load the saved state once, before the training loop (keep the copy only to "
                 "compare against or to restore at the end)" if reset["via"] == "load_state_dict"
                 else "initialise the parameters once, in __init__ or before the training loop, "
                      "not in forward() or inside the loop"))


def _undoes(event, resets) -> bool:
    """An initialiser always discards the values; a load_state_dict only when it loads the same
    unchanged state as a load before it (a state that changes, e.g. federated averaging's
    global weights, moves the parameters on)."""
    if event["via"] != "load_state_dict":
        return True
    state = event.get("state")
    return state is not None and any(
        e.get("state") == state for e in resets if e.seq < event.seq and e["via"] == "load_state_dict")
