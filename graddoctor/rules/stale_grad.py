from __future__ import annotations

from ..findings import Severity
from .base import Rule, related


class StaleGrad(Rule):
    """
    ## What it does
    Finds optimizer steps that update a parameter which got no fresh gradient in this update but
    still holds an old one (already applied, or produced for another optimizer's update).

    ## Why is this bad?
    The optimizer applies the old gradient again, every step, as if it were new: a layer used
    only on some iterations (a conditional head, a frozen-then-unfrozen block) keeps moving in
    the direction of a batch seen long ago. With `set_to_none=True` (the default since
    PyTorch 2.0) the optimizer would skip it instead.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        for p in used_params(i):        # clears only what this step uses
            p.grad = None
        loss_fn(model(x, branch=i % 2), y).backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()           # set_to_none=True: unused params are skipped
        loss_fn(model(x, branch=i % 2), y).backward()
        optimizer.step()
    ```

    ## Stays silent on
    A head used only on some iterations, with `zero_grad()` (set_to_none) every iteration; a
    backbone frozen mid-training whose `.grad` the next `zero_grad()` sets to None; GANs
    with two optimizers (the generator's stray gradients cleared by its own `zero_grad()`);
    a gradient dropped on purpose for the first iterations (DINO's last layer); DDP and FSDP
    with `set_to_none`.
    """

    code = "GD103"
    slug = "stale-grad"
    severity = Severity.WARNING
    summary = "a parameter with no fresh gradient is stepped with an old one"
    fix = "clear all gradients the optimizer owns every update: optimizer.zero_grad() (set_to_none=True)"

    def check(self, a):
        groups: dict = {}
        crossed = a.crossed_old_uses  # optimizers-swapped's: a clear would not fix those
        for use in a.ledger.old_uses:
            if not use.fresh and (use.step.seq, use.pid) not in crossed:
                groups.setdefault(use.step.loc, []).append(use)
        for loc, uses in groups.items():
            first = uses[0]
            pids = [u.pid for u in uses]
            old = first.old[-1]
            yield self.finding(
                f"this step updates {a.names(pids)} with a gradient from an earlier update "
                f"(no new gradient reached them since; first seen at step {first.step_index})",
                loc,
                related=(related(old.backward, "the backward that produced the old gradient"),),
                step=first.step_index,
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "optimizer": first.opt, "already_applied": bool(old.consumed_by)},
            )
