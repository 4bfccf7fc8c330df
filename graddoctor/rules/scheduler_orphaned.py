from __future__ import annotations

from ..findings import Severity
from .base import Rule, plural, related


class SchedulerOrphaned(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler that keeps being stepped after the optimizer it was built
    for has been replaced: the script builds a new optimizer over the same parameters (at an
    unfreeze, a stage change, a resume from a checkpoint) and trains with it, while
    `scheduler.step()` still moves the old optimizer's learning rate. Stays silent when a
    scheduler of the new optimizer is stepped too.

    ## Why is this bad?
    A scheduler holds a reference to the optimizer it was built with and writes the lr of
    *that* optimizer's param groups. The new optimizer starts at the lr it was given and keeps
    it for the rest of training: no warm-up, no decay, although the scheduler runs on and
    `get_last_lr()` reports the schedule as if it were applied.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    for epoch in range(epochs):
        if epoch == unfreeze_at:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_one_epoch(model, optimizer)
        scheduler.step()         # anneals the old optimizer, which no longer steps
    ```

    ## Use instead
    ```python
        if epoch == unfreeze_at:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                optimizer, T_max=epochs - epoch)
    ```
    (or keep one optimizer and add the unfrozen parameters with `optimizer.add_param_group`).

    ## Stays silent on
    A scheduler built for the rebuilt optimizer, the old one dropped with the old optimizer;
    chained schedulers; schedulers of a second optimizer; a hand-written warm-up.
    """

    code = "GD221"
    slug = "scheduler-orphaned"
    severity = Severity.WARNING
    summary = "a scheduler still steps an optimizer that was replaced: the new one's lr never follows it"
    fix = ("build a new scheduler for the new optimizer where you build it (or add the new "
           "parameters to the existing optimizer with add_param_group)")

    def check(self, a):
        scheds = a.schedulers
        stepped_opts = {s.opt for s in scheds.values() if s.count and s.opt is not None}
        inits = a.of_kind("optimizer_init")
        reported = set()
        for s in scheds.values():
            if not s.count or s.opt is None or not s.positional or s.sched in reported:
                continue
            old = s.opt
            old_params = set(a.opt_params.get(old, ()))
            for init in inits:
                new = init["opt"]
                if new == old or new in stepped_opts or old not in a.optimizers \
                        or init.seq < a.optimizers[old].seq:
                    continue
                if not old_params & set(a.opt_params.get(new, ())):
                    continue  # another model's optimizer, not a replacement
                if any(st["opt"] == old and st.seq > init.seq for st in a.steps):
                    continue  # the old one still trains: two optimizers, not a replacement
                new_steps = [st for st in a.steps if st["opt"] == new and st.seq > init.seq]
                # still writing the old optimizer (a script may point scheduler.optimizer at
                # the new one, which the step event then names)
                later = [e for e in s.steps if e.seq > init.seq and e.get("opt") == old]
                if a.count(new_steps) < 2 or not later:
                    continue
                lr = self._lr(a, new)
                held = f" at lr {lr:.3g}" if lr is not None else ""
                reported.add(s.sched)
                yield self.finding(
                    f"{a.optimizer_name(new)} built here replaces {a.optimizer_name(old)}, but "
                    f"{s.cls} was built for the old one and its step() keeps writing the old "
                    f"optimizer's lr: {a.optimizer_name(new)} takes "
                    f"{plural(a.count(new_steps), 'step')}{held} and never follows the schedule",
                    init.loc,
                    related=(related(s.init, f"{s.cls} is bound to {a.optimizer_name(old)} here"),
                             related(later[0], "this step() moves the replaced optimizer's lr")),
                    evidence={"scheduler": s.cls, "old_optimizer": old, "optimizer": new,
                              "steps": a.count(new_steps)},
                )
                break

    @staticmethod
    def _lr(a, opt):
        groups = a.lr_timeline.get(opt) or {}
        points = groups.get(0) or []
        return points[0].lr if points else None
