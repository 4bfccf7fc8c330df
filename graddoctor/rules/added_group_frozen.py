from __future__ import annotations

from ..findings import Severity
from .base import Rule, plural

MIN_STEPS = 2  # steps of the optimizer after the group was added, each with a backward before it


class AddedGroupFrozen(Rule):
    """
    ## What it does
    Finds a param group added to an optimizer that has already stepped
    (`optimizer.add_param_group(...)` mid-run: a backbone unfrozen for fine-tuning) whose
    parameters all had `requires_grad=False` when graddoctor first saw them and received no
    gradient in any backward of the updates that followed.

    ## Why is this bad?
    Adding parameters to an optimizer mid-run says "train these from now on", but a parameter
    that does not require grad gets no `.grad`, and torch's optimizers skip a parameter without
    one: the new group never changes. Progressive unfreezing that adds the group and forgets
    to flip `requires_grad` back (or flips it on a copy) keeps training only the head.

    ## Example
    ```python
    for p in backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
    ...
    if epoch == 1:  # unfreeze the backbone
        optimizer.add_param_group({"params": backbone.parameters(), "lr": 1e-4})
    ```

    ## Use instead
    ```python
    if epoch == 1:
        for p in backbone.parameters():
            p.requires_grad = True
        optimizer.add_param_group({"params": backbone.parameters(), "lr": 1e-4})
    ```

    ## Stays silent on
    Frozen parameters given to an optimizer at construction (a backbone frozen for now, a
    fixed table: harmless and common), a group whose parameters require grad or receive a
    gradient after it was added, and a group added with fewer than two updates replayed after it.
    """

    code = "GD141"
    slug = "added-group-frozen"
    severity = Severity.WARNING
    summary = ("a param group added to an optimizer mid-run holds only parameters with "
               "requires_grad=False: they get no gradient and never train")
    fix = ("set requires_grad=True on those parameters (p.requires_grad_(True)) when you add "
           "their group, or do not add them")

    def check(self, a):
        first_step: dict[int, int] = {}
        for step in a.steps:
            first_step.setdefault(step.get("opt"), step.seq)
        for event in a.by_kind.get("optimizer_init", ()):
            opt = event.get("opt")
            pids = list(event.get("params") or ())
            started = first_step.get(opt)
            if not pids or started is None or started > event.seq:
                continue  # built with the optimizer (frozen for now), or before any step
            if not all(pid in a.params and a.params[pid].get("requires_grad") is False
                       for pid in pids):
                continue
            later = [s for s in a.steps if s.seq > event.seq and s.get("opt") == opt
                     and not s.get("skipped")]
            if sum(a.weight(s) for s in later) < MIN_STEPS:
                continue
            end = a.events[-1].seq + 1
            if any((w := a.last_writer(pid, end)) is not None and w.seq > event.seq for pid in pids):
                continue  # unfrozen after all: a later backward wrote them
            n = len(pids)
            yield self.finding(
                f"the param group added to {a.optimizer_name(opt)} here holds "
                f"{plural(n, 'parameter')} ({a.names(pids)}) that do not require grad, and none "
                f"of them got a gradient in the {plural(sum(a.weight(s) for s in later), 'update')} "
                f"after it: the optimizer skips a parameter without .grad, so the group never trains",
                event.loc, step=a.step_number.get(later[0].seq),
                evidence={"params": a.param_names(pids, 16), "opt": opt})
