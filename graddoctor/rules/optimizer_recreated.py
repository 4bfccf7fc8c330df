from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

# optimizers whose update depends on state kept across steps (moments, running averages); plain
# SGD is left out: without momentum it keeps none, and its momentum is not in the trace
STATEFUL = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad",
                      "Adadelta", "SparseAdam", "Adafactor"})
AT_LEAST = 3  # constructions at the one line, each stepped once at most


class OptimizerRecreated(Rule):
    """
    ## What it does
    Finds a stateful optimizer (Adam, AdamW, RMSprop, Adagrad, ...) constructed again and again
    at the same line over the same parameters, each new one stepped once before the next
    replaces it: the optimizer is built inside the training loop.

    ## Why is this bad?
    Every new optimizer starts from empty state. Adam's moments never build up, so each update
    is the bias-corrected first step, about `lr * sign(grad)` for every parameter whatever its
    gradient's scale; RMSprop and Adagrad divide by one gradient's own magnitude. Training still
    runs, with an update rule that is not the one you chose, and a learning-rate scheduler
    attached to the old optimizer drives nothing.

    ## Example
    ```python
    for x, y in loader:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    ```

    ## Stays silent on
    A fresh optimizer per training stage, each stepped many times; a new model and optimizer
    per trial of a search; an optimizer rebuilt at an unfreeze with a new scheduler for it.
    """

    code = "GD112"
    slug = "optimizer-recreated"
    severity = Severity.WARNING
    summary = ("a stateful optimizer is rebuilt every update: its moments restart from zero "
               "at each step")
    fix = "construct the optimizer once, before the training loop, and reuse it"

    def check(self, a):
        steps: dict[int, int] = {}
        for s in a.steps:
            steps[s["opt"]] = steps.get(s["opt"], 0) + a.weight(s)
        groups: dict[tuple, list] = {}
        for init in a.of_kind("optimizer_init"):
            if init.loc is None or init.get("cls") not in STATEFUL or not init.get("params"):
                continue
            key = (init.loc.path, init.loc.line, init.get("cls"), frozenset(init["params"]))
            groups.setdefault(key, []).append(init)
        for (_path, _line, cls, pids), inits in groups.items():
            opts = list(dict.fromkeys(i["opt"] for i in inits))
            counts = [steps.get(o, 0) for o in opts]
            # a restart per epoch or per stage steps each optimizer many times: not this bug
            if len(opts) < AT_LEAST or max(counts) > 1 or sum(counts) < AT_LEAST - 1:
                continue
            yield self.finding(
                f"a new {cls} is built here over the same {len(pids)} parameters "
                f"{len(opts)} times, and each one is stepped {'once' if max(counts) == 1 else 'never'} "
                f"before the next replaces it: its state (moments, running averages) restarts "
                f"empty at every update, so every step is {cls}'s first step (for Adam about "
                f"lr·sign(grad) per parameter), not the update rule {cls} is meant to apply",
                inits[0].loc,
                related=(related(next((s for s in a.steps if s["opt"] == opts[0]), None),
                                 "the one step the first of them takes"),),
                evidence={"optimizer": cls, "constructions": len(opts),
                          "params": a.param_names(sorted(pids), limit=8), "steps": sum(counts)},
            )
